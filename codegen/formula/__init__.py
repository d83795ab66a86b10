"""The formula language of specs: ``syntax`` (AST and parser), ``expr`` (elementwise formulas, checked
and lowered to C++), ``graph`` (bprop and composite formulas, checked and lowered) and ``lang`` (how
lowered graph formulas are spelled in C++ and Python)."""
