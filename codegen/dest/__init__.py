"""One module per generated artifact: each turns model ops (and their lowered formulas, from
``api``) into the pieces its templates place. ``gen`` assembles the files and writes them."""
