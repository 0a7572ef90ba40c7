#!/usr/bin/env python3
"""The docs' references that can be checked mechanically (issue #33 item 9).

In README.md and docs/**/*.md:
  - every repository path (src/, tools/, tests/, scripts/, bench/, configs/,
    examples/, cmake/, docs/ with a file extension), written relative to the
    repository or to the document (../src/...), names a file that exists;
  - every `Name::name` in backticks (a C++ qualified name) names an
    identifier that some source file defines or uses: its last part must
    appear as a whole word in src/, tools/, tests/ or bench/.
Paths inside URLs, and examples the reader is to create (listed below), are
skipped. Prints one line per broken reference and exits 1 if there is one.

  python3 cmake/check_docs.py REPO_ROOT
"""
import os
import re
import sys

PATH = re.compile(
    r"(?<![\w/.:-])((?:\.\./)*(?:src|tools|tests|scripts|bench|configs|examples|cmake|docs)/[\w./-]*\w\.[A-Za-z]{1,7})\b")
SYMBOL = re.compile(r"`([A-Za-z_]\w*(?:::~?[A-Za-z_]\w*)+)(?:\(\))?`")
URL = re.compile(r"https?://\S+")
# Files the docs tell the reader to write, not files of the repository.
# (A cluster file's profile path is relative to that file, not the doc.)
EXAMPLES = {"docs/profiles/mine.json", "../../docs/profiles/mine.json"}
SOURCE_DIRS = ("src", "tools", "tests", "bench")
SOURCE_EXT = (".h", ".cc", ".cu", ".cuh", ".inc")


def documents(root):
    yield os.path.join(root, "README.md")
    for d, _, files in os.walk(os.path.join(root, "docs")):
        for f in sorted(files):
            if f.endswith(".md"):
                yield os.path.join(d, f)


def source_words(root):
    words = set()
    for top in SOURCE_DIRS:
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if f.endswith(SOURCE_EXT):
                    with open(os.path.join(d, f), encoding="utf-8", errors="replace") as fh:
                        words.update(re.findall(r"\w+", fh.read()))
    return words


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    words = source_words(root)
    broken = []
    paths = symbols = 0
    for doc in documents(root):
        rel_doc = os.path.relpath(doc, root)
        with open(doc, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
        for n, line in enumerate(lines, 1):
            text = URL.sub(" ", line)
            for m in PATH.finditer(text):
                p = m.group(1)
                if p.startswith("../"):
                    target = os.path.normpath(os.path.join(os.path.dirname(doc), p))
                else:
                    target = os.path.join(root, p)
                if p in EXAMPLES or os.path.relpath(target, root) in EXAMPLES:
                    continue
                paths += 1
                if not os.path.exists(target):
                    broken.append(f"{rel_doc}:{n}: names {p}, which does not exist")
            for m in SYMBOL.finditer(line):
                name = m.group(1)
                symbols += 1
                if name.split("::")[-1].lstrip("~") not in words:
                    broken.append(f"{rel_doc}:{n}: names `{name}`, which no source file has")
    for b in broken:
        print(b)
    print(f"check_docs: {paths} paths and {symbols} qualified names in the docs, {len(broken)} broken")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
