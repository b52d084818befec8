#!/usr/bin/python3
"""manifest.py — the corpus of the small trained model: every
/usr/lib/python3.*/**/*.py that is valid UTF-8, in sorted path order, with its
size and sha256, and its split (held-out when the sha256 of its path, as a
number, is 0 mod 10; else train).  The split is by file and depends on the path
only.  `write OUT.tsv --exclude-generated` (a recipe experiment, not the committed
manifest) labels the train side's machine-generated code-page tables (a first line
naming gencodec.py: encodings/cp437.py and 56 near-identical others, 16 % of the
train ids) "generated", which train.py does not train on; held-out files stay
held-out.  Writes the manifest (`write OUT.tsv`), or checks that every file of a
committed manifest is on this machine unchanged (`check IN.tsv`; exit 1
naming the first file that differs).  Other files under /usr/lib/python3.* are
ignored: training reads exactly the manifest's files (read_manifest).
/usr/bin/python3 only (no third-party modules needed).
"""
import glob
import hashlib
import os
import sys

HEADER = "# split\tbytes\tsha256\tpath"


def split_of(path, data, exclude_generated=False):
    if int(hashlib.sha256(path.encode()).hexdigest(), 16) % 10 == 0:
        return "heldout"
    if exclude_generated and b"gencodec.py" in data.split(b"\n", 1)[0]:
        return "generated"
    return "train"


def scan(exclude_generated=False):
    rows = []
    for p in sorted(glob.glob("/usr/lib/python3.*/**/*.py", recursive=True)):
        if not os.path.isfile(p) or os.path.islink(p):
            continue
        data = open(p, "rb").read()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if not data:
            continue
        rows.append((split_of(p, data, exclude_generated), len(data), hashlib.sha256(data).hexdigest(), p))
    return rows


def read_manifest(path):
    """-> [(split, bytes, sha256, path)] in the manifest's order."""
    rows = []
    with open(path) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            s, n, h, p = line.rstrip("\n").split("\t")
            rows.append((s, int(n), h, p))
    return rows


def check(path):
    for s, n, h, p in read_manifest(path):
        try:
            data = open(p, "rb").read()
        except OSError:
            return "%s: missing" % p
        if len(data) != n or hashlib.sha256(data).hexdigest() != h:
            return "%s: differs from the manifest (%d bytes, want %d)" % (p, len(data), n)
    return None


def main(argv):
    excl = argv[3:] == ["--exclude-generated"] and argv[1] == "write"
    if not (len(argv) == 3 or excl) or argv[1] not in ("write", "check"):
        print("usage: manifest.py write OUT.tsv [--exclude-generated] | check IN.tsv", file=sys.stderr)
        return 2
    if argv[1] == "write":
        rows = scan(excl)
        with open(argv[2], "w") as f:
            f.write(HEADER + "\n")
            for r in rows:
                f.write("%s\t%d\t%s\t%s\n" % r)
        tr = [r for r in rows if r[0] == "train"]
        ho = [r for r in rows if r[0] == "heldout"]
        print("manifest: %d files (%d train, %d bytes; %d held-out, %d bytes; %d generated tables)" % (
            len(rows), len(tr), sum(r[1] for r in tr), len(ho), sum(r[1] for r in ho),
            len(rows) - len(tr) - len(ho)))
        return 0
    bad = check(argv[2])
    if bad:
        print("manifest: " + bad, file=sys.stderr)
        return 1
    print("manifest: %s matches this machine" % argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
