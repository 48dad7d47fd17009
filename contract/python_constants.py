#!/usr/bin/env python3
"""The worker contract's constants in the Python package, read from the C++ headers.

python/dist_launch/ is what torch workers import, and parts of it are written into each run
directory alone (the progress hook, the stand-in package): each file must stand by itself, so
the constants are not imported from one module but written into every file that uses them, in a
block this program owns:

    # BEGIN worker contract (contract/python_constants.py; do not edit)
    _SLOT_OFFSET_STEPS = 24
    # END worker contract

The names in a block choose what it holds; this program writes their values. A name is the
header's, in Python's spelling: kFdVariable in namespace heartbeat_slot is SLOT_FD_VARIABLE, a
field of heartbeat_slot::Slot is SLOT_OFFSET_<FIELD> (its byte offset), an enumerator of
Collective is COLLECTIVE_<NAME>, snapshot_format's kMagic is SNAPSHOT_MAGIC (bytes), a
std::chrono::milliseconds is <NAME>_MS; a leading "_" is kept. Names in the worker_contract
namespace have no prefix (kGenerationVariable: GENERATION_VARIABLE).

    python3 contract/python_constants.py           rewrites the blocks
    python3 contract/python_constants.py --check   exits 1 naming each value that differs (CI)
"""
import argparse
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADERS = ("worker_contract.h", "snapshot_format.h")  # in contract/include/dist/contract/
BEGIN = "# BEGIN worker contract (contract/python_constants.py; do not edit)"
END = "# END worker contract"

PREFIX = {"worker_contract": "", "heartbeat_slot": "SLOT_", "snapshot_format": "SNAPSHOT_"}
SIZES = {"std::uint64_t": 8, "std::uint32_t": 4, "std::atomic<std::uint64_t>": 8,
         "std::atomic<std::uint32_t>": 4}


def snake(name):
    """kFdVariable -> FD_VARIABLE; kAllReduce -> ALL_REDUCE."""
    name = name[1:] if re.match(r"k[A-Z]", name) else name
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).upper()


def number(text):
    text = text.replace("'", "")
    return int(text, 16) if text.lower().startswith("0x") else int(text)


def without_comments(text):
    """The text with each comment blanked out, so that positions stay where they were."""
    return re.sub(r"//[^\n]*", lambda m: " " * len(m.group(0)), text)


STATEMENTS = [  # (pattern, what it gives)
    (r'inline\s+constexpr\s+char\s+(k\w+)\[\]\s*=\s*"([^"]*)"\s*;', "string"),
    (r"inline\s+constexpr\s+char\s+(k\w+)\[\d+\]\s*=\s*\{([^}]*)\}\s*;", "bytes"),
    (r"inline\s+constexpr\s+(?:std::)?(?:u?int\d+_t|size_t|int)\s+(k\w+)\s*=\s*"
     r"([0-9a-fA-Fx']+)(?:ULL\s*<<\s*(\d+))?\s*;", "integer"),
    (r"inline\s+constexpr\s+std::chrono::milliseconds\s+(k\w+)\s*\{([0-9']+)\}\s*;", "ms"),
    (r"enum\s+class\s+(\w+)\s*:\s*std::uint32_t\s*\{([^}]*)\}", "enum"),
    (r"struct\s+(Slot)\s*\{([^}]*)\}", "slot"),  # after the sizes it names
]


def constants(root=ROOT):
    """Every constant of the headers under `root`, by its Python name."""
    values = {}
    for name in HEADERS:
        raw = open(os.path.join(root, "contract", "include", "dist", "contract", name)).read()
        # Each namespace from its opening to its "}  // namespace NAME".
        spans = [(m.start(), raw.index("}  // namespace " + m.group(0)[10:-2], m.end()),
                  m.group(1)) for m in re.finditer(r"namespace (?:dist::)?(\w+) \{", raw)]

        def prefix(at):
            inner = [s for s in spans if s[0] <= at < s[1]]
            return PREFIX[max(inner)[2]] if inner else ""

        text = without_comments(raw)
        for pattern, kind in STATEMENTS:
            for m in re.finditer(pattern, text):
                read(kind, m, prefix(m.start()), values)
    return values


def read(kind, m, prefix, values):
    name = prefix + snake(m.group(1))
    if kind == "string":
        values[name] = m.group(2)
    elif kind == "bytes":
        values[name] = "".join(re.findall(r"'(.)'", m.group(2))).encode()
    elif kind == "integer":
        values[name] = number(m.group(2)) << (int(m.group(3)) if m.group(3) else 0)
    elif kind == "ms":
        values[name + "_MS"] = number(m.group(2))
    elif kind == "enum":
        names = [n.strip() for n in m.group(2).split(",") if n.strip()]
        for index, enumerator in enumerate(names):
            values[snake(m.group(1)) + "_" + snake(enumerator)] = index
    else:  # the slot: each field at its natural alignment
        offset = 0
        for field in filter(None, (" ".join(f.split()) for f in m.group(2).split(";"))):
            f = re.match(r"(.+?) (\w+)(?:\[(\w+)\])?$", field)
            kind_, field_name, count = f.group(1), f.group(2), f.group(3)
            if kind_ == "char":
                size, align = values[prefix + snake(count)], 1
            elif kind_ == "GroupSequence":
                size, align = 16 * values[prefix + snake(count)], 8
            else:
                size = align = SIZES[kind_]
            offset = (offset + align - 1) // align * align
            values[prefix + "OFFSET_" + field_name.upper()] = offset
            offset += size


def literal(value):
    """A value as the package's code spells it: double quotes, a magic number in hex."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bytes):
        return "b" + json.dumps(value.decode("ascii"))
    return hex(value) if value >= 1 << 32 else str(value)


def rewrite(path, values, check):
    lines = open(path).read().split("\n")
    out, inside, wrong = [], False, []
    for number_, line in enumerate(lines, 1):
        if line == BEGIN:
            inside = True
        elif line == END:
            inside = False
        elif inside and line.strip() and not line.startswith("#"):
            m = re.match(r"(_?)(\w+) = ", line)
            if not m or m.group(2) not in values:
                sys.exit(f"{path}:{number_}: no constant of the contract is called "
                         f"{line.split('=')[0].strip()!r}")
            line = f"{m.group(1)}{m.group(2)} = {literal(values[m.group(2)])}"
            if line != lines[number_ - 1]:
                wrong.append(f"{path}:{number_}: {lines[number_ - 1]!r} should be {line!r}")
        out.append(line)
    if inside:
        sys.exit(f"{path}: '{BEGIN}' without '{END}'")
    if wrong and not check:
        open(path, "w").write("\n".join(out))
    return wrong


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a block differs from the headers")
    parser.add_argument("--root", default=ROOT, help="the source tree (default: this one)")
    args = parser.parse_args()
    values = constants(args.root)
    wrong = []
    blocks = 0
    package = os.path.join(args.root, "python", "dist_launch")
    for name in sorted(os.listdir(package)):
        path = os.path.join(package, name)
        if name.endswith(".py") and BEGIN in open(path).read():
            blocks += 1
            wrong += rewrite(path, values, args.check)
    if blocks == 0:
        sys.exit(f"no '{BEGIN}' block in {package}")
    for w in wrong:
        print(w, file=sys.stderr if args.check else sys.stdout)
    if args.check and wrong:
        print("run python3 contract/python_constants.py to write them", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
