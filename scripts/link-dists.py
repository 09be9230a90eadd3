"""Hard-links installed distributions (and everything they require) from one
venv's site-packages into another's, so pip in the target sees them installed
and the bytes exist once on disk. Falls back to copying across filesystems.

usage: link-dists.py SOURCE_PYTHON TARGET_SITE_PACKAGES DIST...

Used by scripts/setup-lmcache.sh to share vLLM's torch (with its CUDA runtime
wheels, ~5 GB) instead of installing a second copy.
"""
import json
import os
import shutil
import subprocess
import sys

source_python, target, *roots = sys.argv[1:]
# Ask the source interpreter for the closure of the given distributions:
# (site-packages dir, [relative file paths]) per distribution.
probe = r"""
import json, sys
from importlib.metadata import distribution, PackageNotFoundError
from packaging.requirements import Requirement
seen, todo, out = set(), list(sys.argv[1:]), []
while todo:
    name = todo.pop()
    key = name.lower().replace("_", "-")
    if key in seen:
        continue
    seen.add(key)
    try:
        dist = distribution(name)
    except PackageNotFoundError:
        continue
    base = str(dist.locate_file(""))
    out.append([dist.metadata["Name"], dist.version, base, [str(f) for f in dist.files or []]])
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            todo.append(req.name)
print(json.dumps(out))
"""
dists = json.loads(subprocess.check_output([source_python, "-c", probe, *roots]))
linked = 0
for name, version, base, files in dists:
    for rel in files:
        if rel.startswith(".."):  # console scripts: their shebang names the source venv
            continue
        src = os.path.join(base, rel)
        dst = os.path.join(target, rel)
        if not os.path.isfile(src) or os.path.exists(dst):
            continue
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
        linked += 1
    print(f"  shared {name} {version}")
print(f"  {linked} files linked from {source_python}")
