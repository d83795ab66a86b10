#!/usr/bin/env bash
# Developer loop without pip: build into a meson build directory and run Python against it.
#
#   tools/dev.sh build           configure (once) and build incrementally
#   tools/dev.sh pytest [ARGS]   build, then run pytest against the build
#   tools/dev.sh python [ARGS]   build, then run python against the build
#
# Needs meson, ninja, pybind11, jinja2, cerberus, pyyaml and numpy in the current Python.
# OPFORGE_BUILD_DIR picks the build directory (default: ./build), OPFORGE_BACKEND the wheel backend
# (cpu, or cuda: nvcc 13 found by pkg/opforge/_cuda_toolkit.py), OPFORGE_MESON_ARGS extra setup
# arguments (-Dops_cuda_arch=9.0).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${OPFORGE_BUILD_DIR:-$root/build}
backend=${OPFORGE_BACKEND:-cpu}
cmd=${1:-build}
shift || true

mkdir -p "$build"
setup_args=(-Dops_backend="$backend")
if [ "$backend" = cuda ]; then
  python3 "$root/pkg/opforge/_cuda_toolkit.py" --native-file "$build/.opforge-native.ini"
  setup_args+=(--native-file "$build/.opforge-native.ini")
fi
# shellcheck disable=SC2206
setup_args+=(${OPFORGE_MESON_ARGS:-})

# meson learns the list of specs (and kernels) at configure time: reconfigure when it changes
specs=$(cd "$root" && { ls op_specs/*.yaml src/kernels/*/*.cpp src/kernels/*/*.cu 2>/dev/null || true; } | sort)
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" "$root" "${setup_args[@]}" >"$build/.opforge-setup.log" || { cat "$build/.opforge-setup.log"; exit 1; }
elif [ "$specs $backend" != "$(cat "$build/.opforge-sources" 2>/dev/null)" ]; then
  meson setup --reconfigure "$build" "$root" "${setup_args[@]}" >"$build/.opforge-setup.log" || { cat "$build/.opforge-setup.log"; exit 1; }
fi
echo "$specs $backend" > "$build/.opforge-sources"
ninja -C "$build" >/dev/null || ninja -C "$build"

# A package directory that mirrors the installed layout, made of links into the tree.
pkg="$build/python/opforge"
rm -rf "$pkg"
mkdir -p "$pkg"
for f in "$root"/pkg/opforge/*; do case "$f" in *.in) ;; *) ln -s "$f" "$pkg/" ;; esac; done
for f in "$build"/_C*.so "$build"/lib*.so "$build"/_build_info.py "$build"/op_specs/ops.pyi "$build"/op_specs/_formulas.py; do
  ln -s "$f" "$pkg/"
done
ln -s "$root/codegen" "$pkg/codegen"
ln -s "$root/op_specs" "$pkg/op_specs"
mkdir -p "$pkg/include"
ln -s "$root/src/runtime" "$pkg/include/runtime"
ln -s "$root/src/aot" "$pkg/include/aot"
ln -s "$root/src/python" "$pkg/include/python"
ln -s "$root/src/torch_native" "$pkg/include/torch_native"
ln -s "$root/src/jax_native" "$pkg/include/jax_native"
ln -s "$build/op_specs" "$pkg/include/ops"
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"

case "$cmd" in
  build) ;;
  pytest) exec python3 -m pytest -p no:cacheprovider "$@" ;;
  python) exec python3 "$@" ;;
  *) echo "usage: tools/dev.sh build|pytest|python [ARGS]" >&2; exit 2 ;;
esac
