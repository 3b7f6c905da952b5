"""The duplicate finder's pairs against the committed baseline (.ci/duplicates-baseline.txt).

    python3 .ci/duplicates.py            run ``duplicates`` on the checkout, print the count and
                                         the pairs of files not in the baseline (never fails)
    python3 .ci/duplicates.py --update   write the current pairs as the new baseline

A pair is named by its two files, not its line numbers (which move with every edit above them),
counted once per row: a file pair with more rows than the baseline lists its rows as new. The
``duplicates`` command is a tool of the development machines; without it nothing is checked.
"""

import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / ".ci" / "duplicates-baseline.txt"
ROW = re.compile(r"^D\d+ (\S+?):\d+-\d+ ~ (\S+?):\d+-\d+")


def pairs(text: str) -> list:
    """(row, 'a ~ b' with the two files sorted) for every row of the finder's output."""
    out = []
    for line in text.splitlines():
        m = ROW.match(line)
        if m:
            out.append((line, " ~ ".join(sorted(m.groups()))))
    return out


def main(argv: list) -> int:
    if shutil.which("duplicates") is None:
        print("duplicates: skipped (no duplicates command on this machine)")
        return 0
    run = subprocess.run(
        ["duplicates", "--most", "200", "--seconds", "300", "--repo", str(ROOT)], capture_output=True, text=True
    )
    rows = pairs(run.stdout)
    for line in run.stdout.splitlines():
        if line.startswith(("incomplete:", "(+")):
            print(f"duplicates: {line}")
    if "--update" in argv:
        BASELINE.write_text("".join(f"{key}\n" for _, key in sorted(rows, key=lambda r: r[1])))
        print(f"duplicates: baseline written, {len(rows)} pairs")
        return 0
    base = Counter(BASELINE.read_text().split("\n")) if BASELINE.exists() else Counter()
    base.pop("", None)
    seen: Counter = Counter()
    new = []
    for line, key in rows:
        seen[key] += 1
        if seen[key] > base[key]:
            new.append(line)
    gone = sum((base - seen).values())
    print(f"duplicates: {len(rows)} pairs (baseline {sum(base.values())}); {len(new)} new, {gone} gone")
    for line in new:
        print(f"  new: {line}")
    return 0  # a report, not a gate: each new pair is a place to look


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
