#!/usr/bin/env bash
# Fetch llama.cpp's own conformance material: the vocabulary-only GGUFs with their
# test-tokenizer-0 cases (`ggml-vocab-NAME.gguf` + `.inp`/`.out`) and the real chat
# templates (`templates/*.jinja`), from the llama-cpp-python 0.3.36 sdist on PyPI, which
# vendors llama.cpp. Idempotent: a complete folder is left alone.
#
#   scripts/fetch-llamacpp-suite.sh          # into models/llamacpp-suite/
#
# The folder is $POCKETCHAT_LLAMACPP_SUITE if set (the tests read the same variable). The
# sdist comes from PyPI's simple index (not `pip download`, which would build the package's
# build tools from source), is checked against its pinned sha256, and only the files above
# are taken out (~80 MB). Set POCKETCHAT_LLAMACPP_SDIST to a local copy of the tarball to
# work offline.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${POCKETCHAT_LLAMACPP_SUITE:-$repo/models/llamacpp-suite}
python=${POCKETCHAT_PYTHON:-python3}

exec "$python" - "$dir" "${POCKETCHAT_LLAMACPP_SDIST:-}" <<'PY'
import hashlib, os, re, shutil, sys, tarfile, tempfile, urllib.request

dest, local = sys.argv[1], sys.argv[2]
NAME, VERSION = "llama_cpp_python", "0.3.36"
SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
INDEX = "https://pypi.org/simple/llama-cpp-python/"
PREFIX = f"{NAME}-{VERSION}/vendor/llama.cpp/models/"
stamp = os.path.join(dest, ".complete")

def die(msg):
    print(f"fetch-llamacpp-suite: {msg}", file=sys.stderr)
    sys.exit(1)

if os.path.exists(stamp) and open(stamp).read().strip() == SHA256:
    print(f"fetch-llamacpp-suite: {dest} is complete")
    sys.exit(0)

def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()

def download(tmp):
    page = urllib.request.urlopen(INDEX, timeout=60).read().decode()
    links = re.findall(rf'href="([^"#]*/{NAME}-{re.escape(VERSION)}\.tar\.gz)(?:#[^"]*)?"', page)
    if not links:
        die(f"{NAME}-{VERSION}.tar.gz is not listed at {INDEX}")
    path = os.path.join(tmp, f"{NAME}-{VERSION}.tar.gz")
    print(f"fetch-llamacpp-suite: downloading {links[0]}")
    with urllib.request.urlopen(links[0], timeout=180) as r, open(path, "wb") as f:
        shutil.copyfileobj(r, f, 1 << 20)
    return path

def wanted(name):
    if not name.startswith(PREFIX):
        return None
    rest = name[len(PREFIX):]
    if re.fullmatch(r"ggml-vocab-[\w.-]+\.gguf(\.inp|\.out)?", rest) or re.fullmatch(r"templates/[^/]+\.jinja", rest):
        return rest
    return None

with tempfile.TemporaryDirectory() as tmp:
    tarball = local or download(tmp)
    got = sha256(tarball)
    if got != SHA256:
        die(f"{tarball} has sha256 {got}, expected {SHA256}")
    part = dest + ".part"
    shutil.rmtree(part, ignore_errors=True)
    os.makedirs(os.path.join(part, "templates"))
    count = 0
    with tarfile.open(tarball) as tar:
        for member in tar:
            rest = wanted(member.name)
            if rest is None or not member.isfile():
                continue
            with tar.extractfile(member) as src, open(os.path.join(part, rest), "wb") as out:
                shutil.copyfileobj(src, out)
            count += 1
    if count == 0:
        die(f"no conformance files in {tarball}")
    with open(os.path.join(part, ".complete"), "w") as f:
        f.write(SHA256 + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(part, dest)
    print(f"fetch-llamacpp-suite: {count} files in {dest}")
PY
