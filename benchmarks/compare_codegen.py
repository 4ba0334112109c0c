"""Compare two dump_codegen.py directories: byte for byte, and with index symbol names made
canonical (renamed by first appearance within each kernel function) and cache paths blanked,
to tell renamed symbols from changed code.

    python benchmarks/compare_codegen.py BEFORE AFTER
"""
from __future__ import annotations

import difflib
import os
import re
import sys

# index symbols: q3 (renamed by the old canonical_names), o3 i3 s3 v3 (per-kernel ranges),
# ind<digest> (indirect index values)
SYMBOL = re.compile(r"\b(?:q\d+|[oisv]\d+|ind[0-9a-f]{10})\b")
KERNEL = re.compile(r'^(?=extern "C" void kernel|def kernel|kernel\w* = kernel)', re.M)
PATHS = re.compile(r"(k_|module_|/)[0-9a-f]{16,}")


def canonical(text: str) -> str:
    head, *kernels = KERNEL.split(text)
    out = [PATHS.sub(r"\1<hash>", head)]
    for chunk in kernels:
        names: dict[str, str] = {}
        out.append(SYMBOL.sub(lambda m: names.setdefault(m.group(0), f"S{len(names)}"), chunk))
    return "".join(out)


def files(root: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root)
                  for d, _, fs in os.walk(root) for f in fs)


def main(before: str, after: str) -> int:
    a, b = files(before), files(after)
    if a != b:
        print("file lists differ:", sorted(set(a) ^ set(b)))
    same = renamed = 0
    for rel in sorted(set(a) & set(b)):
        x = open(os.path.join(before, rel)).read()
        y = open(os.path.join(after, rel)).read()
        if x == y:
            same += 1
            continue
        cx, cy = canonical(x), canonical(y)
        if cx == cy:
            renamed += 1
            continue
        print(f"--- {rel}: differs beyond symbol names")
        sys.stdout.writelines(list(difflib.unified_diff(
            cx.splitlines(True), cy.splitlines(True), n=1))[:80])
    print(f"{same} identical, {renamed} equal up to symbol names, "
          f"{len(set(a) & set(b)) - same - renamed} different")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
