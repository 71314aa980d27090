"""compare.py PRISTINE.txt SERIES.txt: tests that pass on pristine but not with the series."""

import sys


def load(path):
    out = {}
    for line in open(path):
        outcome, nodeid, why = (line.rstrip("\n").split("\t") + ["", ""])[:3]
        out[nodeid] = (outcome, why)
    return out


pristine, series = load(sys.argv[1]), load(sys.argv[2])
passed_p = [n for n, (o, _) in pristine.items() if o == "PASS"]
passed_s = [n for n, (o, _) in series.items() if o == "PASS"]
print(f"tests collected: pristine {len(pristine)}, series {len(series)}")
print(f"passed: pristine {len(passed_p)}, series {len(passed_s)}")
broken = [n for n in passed_p if series.get(n, ("MISSING", ""))[0] != "PASS"]
print(f"pass on pristine, not with the series: {len(broken)}")
for n in broken:
    o, why = series.get(n, ("MISSING", "not collected"))
    print(f"  {o}\t{n}\t{why}")
sys.exit(1 if broken else 0)
