"""Turn a junit xml into lines: OUTCOME<TAB>nodeid<TAB>one-line reason."""

import sys
import xml.etree.ElementTree as ET


def reason(el):
    msg = (el.get("message") or "").strip().splitlines()
    if msg:
        return msg[0][:240]
    text = (el.text or "").strip().splitlines()
    return text[-1][:240] if text else ""


for case in ET.parse(sys.argv[1]).getroot().iter("testcase"):
    nodeid = case.get("classname", "") + "::" + case.get("name", "")
    outcome, why = "PASS", ""
    for tag, name in (("failure", "FAIL"), ("error", "ERROR"), ("skipped", "SKIP")):
        el = case.find(tag)
        if el is not None:
            outcome, why = name, reason(el)
            break
    print(f"{outcome}\t{nodeid}\t{why}")
