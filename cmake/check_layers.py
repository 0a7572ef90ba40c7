#!/usr/bin/env python3
"""The include check: no file under src/ includes a layer it may not use.

Usage: check_layers.py [REPO_ROOT]

Reads the layers and what each may use from cmake/layers.txt, scans every
`#include "x/..."` in src/ (quoted includes whose first folder is a layer),
and prints one line per violation,
    src/tensor/arena.cc:7: includes "kernels/cuda/device.h": layer tensor may not use kernels/cuda
then exits 1; exits 0 when there is none. A layer may use itself, the layers
its line names, and what those may use, transitively. Includes of files that
are not under src/ (<...>, "tools/...") are not checked.
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCE_EXT = (".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh", ".inc")


def read_layers(path):
    """{layer: [direct deps]} in file order; errors for unknown or upward deps."""
    layers = {}
    for lineno, line in enumerate(open(path, encoding="utf-8"), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        name, deps = words[0], words[1:]
        for d in deps:
            if d not in layers:
                sys.exit(f"{path}:{lineno}: layer {name} uses {d}, which is not declared above it")
        if name in layers:
            sys.exit(f"{path}:{lineno}: layer {name} declared twice")
        layers[name] = deps
    return layers


def closure(layers):
    """{layer: set of layers it may use, itself included}."""
    allowed = {}
    for name, deps in layers.items():  # file order is bottom first
        s = {name}
        for d in deps:
            s |= allowed[d]
        allowed[name] = s
    return allowed


def layer_of(rel, layers):
    """The longest declared layer folder containing rel (a path under src/)."""
    best = None
    for name in layers:
        if rel.startswith(name + "/") and (best is None or len(name) > len(best)):
            best = name
    return best


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    layers = read_layers(os.path.join(root, "cmake", "layers.txt"))
    allowed = closure(layers)
    src = os.path.join(root, "src")
    violations, files = [], 0
    for dirpath, _, names in os.walk(src):
        for n in sorted(names):
            if not n.endswith(SOURCE_EXT):
                continue
            path = os.path.join(dirpath, n)
            rel = os.path.relpath(path, src).replace(os.sep, "/")
            files += 1
            own = layer_of(rel, layers)
            if own is None:
                violations.append(f"src/{rel}:1: is in no layer: add its folder to cmake/layers.txt")
                continue
            for lineno, line in enumerate(open(path, encoding="utf-8", errors="replace"), 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                target = layer_of(m.group(1), layers)
                if target is None or target in allowed[own]:
                    continue
                violations.append(f'src/{rel}:{lineno}: includes "{m.group(1)}": '
                                  f"layer {own} may not use {target}")
    for v in sorted(violations):
        print(v)
    if violations:
        print(f"check_layers: {len(violations)} violation(s) in {files} files (layers: cmake/layers.txt)")
        return 1
    print(f"check_layers: {files} files under src/, {len(layers)} layers, no violation")
    return 0


if __name__ == "__main__":
    sys.exit(main())
