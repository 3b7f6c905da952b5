#!/usr/bin/env bash
# GPU acceptance on the device machine: install what was carried, run scripts/gpu_acceptance.py
# with its result files written into $OUT (the acceptance JSON and markdown, issue 59's summary
# gpu-acceptance.json) and the log beside them. See that script's docstring for the calls
# (--preset issue59: issue 59's steps alone).
#
#   bash scripts/gpu_acceptance.sh stage      # a call of its own: keep the carried pieces (.g4a ...)
#                                             # in /tmp/stage (/tmp survives while the machine is warm)
#   bash scripts/gpu_acceptance.sh [ARGS]     # install PySCF (+ gpu4pyscf), jsonschema and its
#                                             # dependencies, threadpoolctl into /tmp/site, then
#                                             # python scripts/gpu_acceptance.py ARGS
# Both routes carry the same pure-Python extras: .whl/ holds their wheels, the pieces their unpacked tree.
set -uo pipefail
SITE=${SITE:-/tmp/site} STAGE=${STAGE:-/tmp/stage}
OUT=${OUT:-scripts/results}
mkdir -p "$SITE" "$STAGE" "$OUT"
for d in .g4?; do [ -d "$d" ] && cp "$d"/pack.* "$STAGE"/; done
if [ "${1:-}" = stage ]; then
    ls -l "$STAGE"; exit 0
fi
if ls "$STAGE"/pack.tar.xz.* >/dev/null 2>&1; then          # PySCF and gpu4pyscf, in pieces
    want=$(cat "$STAGE"/pack.parts) have=$(ls "$STAGE"/pack.tar.xz.* | wc -l)
    if [ "$want" != "$have" ]; then
        echo "error: $have of $want pieces in $STAGE: the machine went cold between the calls; start again from the first" >&2
        exit 3
    fi
    if command -v xz >/dev/null; then unxz="xz -dc"; else unxz="python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)'"; fi
    cat "$STAGE"/pack.tar.xz.* | eval "$unxz" | tar -x -C "$SITE" || { echo "error: unpacking the pieces failed" >&2; exit 3; }
    # gpu4pyscf loads a libxc from its own lib/deps; only DFT needs the GPU libxc, the import needs the name
    mkdir -p "$SITE"/gpu4pyscf/lib/deps/lib
    [ -e "$SITE"/gpu4pyscf/lib/deps/lib/libxc.so ] || ln -sf "$SITE"/pyscf/lib/deps/lib/libxc.so "$SITE"/gpu4pyscf/lib/deps/lib/libxc.so
elif ls .whl/*.whl >/dev/null 2>&1; then                    # PySCF alone
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
        || { echo "error: installing .whl failed" >&2; exit 3; }
else
    echo "error: no PySCF carried (.whl or .g4a...): run python scripts/gpu_acceptance.py --prepare-wheels here first" >&2
    exit 3
fi
export PYTHONPATH="$PWD:$SITE" PYTHONUNBUFFERED=1
for mod in jsonschema threadpoolctl; do   # the cuda tests validate documents; the baseline records BLAS
    python3 -c "import $mod" 2>/dev/null || echo "warning: $mod not importable: the carried folders predate it; run --prepare-wheels again" >&2
done
python3 scripts/gpu_acceptance.py --out-dir "$OUT" "$@" 2>&1 | tee "$OUT"/gpu_acceptance.log
exit "${PIPESTATUS[0]}"
