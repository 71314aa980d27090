"""Check that the docs name only things that exist.

    python scripts/check_docs.py [--tree DIR] [FILE.md ...]

Reads README.md, docs/*.md and every other README.md of the repository (or
the files given) and prints one line per name that neither this repository
nor the patched SGLang tree (``.cache/trees/sglang-0.5.23-series-repo``,
which ``make setup`` builds) holds; exit status 1 if there is one. It checks:

* file and patch paths in backticks, and the targets (and anchors) of
  relative markdown links; no path may leave the repository (``../shared``);
* functions: a backticked ``name()`` or ``name(args)`` must be defined
  (``def``/``class``/an assignment) somewhere; a backticked dotted name's
  last part, a snake_case name or a CamelCase name must occur in the code;
* command-line flags (``--some-flag``, in backticks or code blocks);
* environment variables (ALL_CAPS names with an underscore in backticks or
  code blocks), unless listed in ``EXTERNAL_ENV`` with the reason;
* metric names (``sglang:...``);
* commit ids quoted as ``commit <id>`` or ``at <id>`` (``git cat-file -e``).

"The code" is every ``*.py``, ``*.sh``, ``Makefile``, ``*.ini`` and
``*.patch`` of this repository and every ``*.py`` of the patched tree.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from typing import Dict, Iterable, List, Optional, Set, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_TREE = os.path.join(ROOT, ".cache", "trees", "sglang-0.5.23-series-repo")
SKIP_DIRS = {".git", ".venv", ".cache", "out", "__pycache__", "node_modules"}
# SGLang's diffusion runtime and kernel sources: no doc names them, and they are
# two thirds of the tree's Python.
TREE_SKIP_DIRS = {"multimodal_gen", "kernels"}
CODE_SUFFIXES = (".py", ".sh", ".patch", ".ini", ".toml", ".cfg")

# Flags of other programs that the docs quote in commands (each program named).
EXTERNAL_FLAGS = {
    "--keep-non-patch": "git am",
    "--name-only": "git diff",
    "--no-deps": "pip install / pip download",
    "--query-gpu": "nvidia-smi",
    "--format": "nvidia-smi",
    "--showdriverversion": "rocm-smi",
    "--showproductname": "rocm-smi",
    "--showmeminfo": "rocm-smi",
    "--mem-usage": "amd-smi metric",
    "--nproc-per-node": "torchrun",
    "--nonblocking": "py-spy record",
    "--threads": "py-spy record",
    "--version": "python3 / cc",
    "--help": "every tool's argparse",
    "--dist": "pytest-xdist",
    "--no-loadscope-reorder": "pytest-xdist",
}

# Names of other projects that the docs discuss (the project named).
EXTERNAL_NAMES = {
    "test/registered/chunked_prefill/test_mm_chunked_embedding_unit.py": "SGLang's repository test",
    "super": "Python built-in",
    "lru_cache": "functools",
    "malloc_trim": "glibc",
    "native_layer_norm": "an aten operator",
    "supports_encoder_tp_data": "vLLM",
    "cudagraph_mm_encoder": "vLLM",
    "encoder_cudagraph_token_budgets": "vLLM",
    "_use_per_request_encode_fallback": "SGLang PR #33751 (open)",
    "--vit-cuda-graph-token-budgets": "SGLang draft PR #25986 (closed)",
    ".pre-commit-config.yaml": "SGLang's repository root (not in the wheel)",
    ".isort.cfg": "SGLang's repository root (not in the wheel)",
    "python/pyproject.toml": "SGLang's repository (not in the wheel)",
}

# Environment variables read by other software, not by this repository's code.
EXTERNAL_ENV = {
    "HIP_VISIBLE_DEVICES": "ROCm's device filter (HIP runtime)",
    "ROCR_VISIBLE_DEVICES": "ROCm's device filter (ROCr runtime)",
    "CUDA_VISIBLE_DEVICES": "CUDA's device filter",
    "TORCH_LOGS": "torch's logging switch",
    "TORCHINDUCTOR_CACHE_DIR": "torch Inductor's cache folder",
    "TRITON_CACHE_DIR": "Triton's cache folder",
    "TORCHDYNAMO_DISABLE": "torch Dynamo's off switch",
    "OMP_NUM_THREADS": "OpenMP's thread count",
    "HF_HUB_OFFLINE": "huggingface_hub's offline switch",
    "TRANSFORMERS_OFFLINE": "transformers' offline switch",
    "AITER_JIT_DIR": "aiter's JIT folder (newer releases)",
    "JIT_WORKSPACE_DIR": "aiter's JIT folder (older releases)",
    "MALLOC_MMAP_THRESHOLD_": "glibc malloc tunable",
    "PYTEST_ADDOPTS": "pytest's extra command-line options",
}

# A dotted name starting with one of these is another library's, not checked.
EXTERNAL_MODULES = {
    "torch",
    "functools",
    "importlib",
    "huggingface_hub",
    "os",
    "sys",
    "np",
    "numpy",
    "transformers",
    "triton",
    "aiter",
    "prometheus_client",
    "json",
    "subprocess",
    "sgl_kernel",
    "vllm",
}

_FENCE = re.compile(r"^(```|~~~)")
_INLINE = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9]*(?:-[a-z0-9]+)*)")
_ENV = re.compile(r"(?<![\w.])([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+_?)(?![\w(])")
_METRIC = re.compile(r"sglang:[a-z_]+(?:\{[a-z_]+(?:,[a-z_]+)+\}[a-z_]*)?")
_COMMIT = re.compile(r"\b(?:commit|at)\s+`?([0-9a-f]{7,40})\b")
_CALL = re.compile(r"^([A-Za-z_][\w.]*)\((.*)\)$")
_DOTTED = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+$")
_SNAKE = re.compile(r"^_*[a-z][a-z0-9]*(?:_[a-z0-9]+)+$")
_CAMEL = re.compile(r"^_?[A-Z][a-z0-9]+(?:[A-Z0-9][A-Za-z0-9]*)+$")
_PATCH_STEM = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+){4,}$")
_PATHLIKE = re.compile(r"^[\w.][\w./-]*$")
_FILE_EXT = re.compile(
    r"\.(py|sh|md|patch|txt|log|json|ini|toml|whl|pyz|yaml|cfg|jsonl)$"
)
_DEF = re.compile(r"^\s*(?:async\s+)?(?:def|class)\s+(\w+)", re.M)
_ASSIGN = re.compile(r"^\s*(?:self\.)?(\w+)\s*(?::[^=\n]*)?=(?!=)", re.M)
_FIELD = re.compile(r"^\s*(\w+)\s*:\s*\S", re.M)  # a dataclass field, however long
_WORD = re.compile(r"[A-Za-z_]\w*")


class CodeIndex:
    """What the code holds: text per file, defined names, words, file paths."""

    def __init__(self, roots: Iterable[Tuple[str, str]]):
        self.paths: Set[str] = set()  # relative paths, as the tree lays them out
        self.basenames: Set[str] = set()
        self.defined: Set[str] = set()
        self.words: Set[str] = set()
        self.texts: List[str] = []
        for root, prefix in roots:
            self._walk(root, prefix)
        self.blob = "\n".join(self.texts)

    def _walk(self, root: str, prefix: str) -> None:
        for d, dirs, files in os.walk(root):
            dirs[:] = [x for x in dirs if x not in SKIP_DIRS | TREE_SKIP_DIRS]
            for f in files:
                full = os.path.join(d, f)
                if full == os.path.abspath(__file__):
                    continue  # its own lists must not vouch for themselves
                rel = os.path.relpath(full, root)
                self.paths.add(os.path.join(prefix, rel) if prefix else rel)
                self.basenames.add(f)
                if f.endswith(CODE_SUFFIXES) or f == "Makefile":
                    try:
                        with open(full, encoding="utf-8", errors="replace") as fh:
                            text = fh.read()
                    except OSError:
                        continue
                    self.texts.append(text)
                    self.defined.update(_DEF.findall(text))
                    self.defined.update(_ASSIGN.findall(text))
                    self.defined.update(_FIELD.findall(text))
                    self.words.update(_WORD.findall(text))
            for x in dirs:
                self.paths.add(
                    os.path.join(prefix, os.path.relpath(os.path.join(d, x), root))
                    if prefix
                    else os.path.relpath(os.path.join(d, x), root)
                )

    def has_path(self, path: str) -> bool:
        path = path.rstrip("/")
        if path in self.paths or path in self.basenames:
            return True
        suffix = "/" + path
        return any(p.endswith(suffix) for p in self.paths)


def doc_files(root: str) -> List[str]:
    out = [os.path.join(root, "README.md")]
    docs = os.path.join(root, "docs")
    out += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS and x != "docs")
        if d != root and "README.md" in files:
            out.append(os.path.join(d, "README.md"))
    return out


def github_anchor(heading: str) -> str:
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors_of(path: str) -> Set[str]:
    seen: Dict[str, int] = {}
    out = set()
    in_fence = False
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if _FENCE.match(line):
                in_fence = not in_fence
                continue
            if in_fence or not line.startswith("#"):
                continue
            a = github_anchor(line.lstrip("#"))
            n = seen.get(a, 0)
            seen[a] = n + 1
            out.add(a if n == 0 else f"{a}-{n}")
    return out


def split_doc(text: str) -> Tuple[List[Tuple[int, str]], List[Tuple[int, str]]]:
    """(inline code spans, code-block lines), each with its line number."""
    spans, block = [], []
    in_fence = False
    for n, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line.strip()):
            in_fence = not in_fence
            continue
        if in_fence or line.startswith("    "):
            block.append((n, line))
        else:
            spans += [(n, s) for s in _INLINE.findall(line)]
    return spans, block


def _placeholder(s: str) -> bool:
    return any(c in s for c in "<>*…${}[]|\"'=") or "..." in s


class Checker:
    def __init__(self, index: CodeIndex, root: str, git_dir: str):
        self.index = index
        self.root = root
        self.git_dir = git_dir
        self._anchors: Dict[str, Set[str]] = {}
        self._commits: Dict[str, bool] = {}

    def _in_code(self, s: str) -> bool:
        return s in self.index.blob

    def _names_file(self, name: str) -> bool:
        """``name`` occurs in the code, not as the tail of a longer name."""
        blob, i = self.index.blob, self.index.blob.find(name)
        while i >= 0:
            before = blob[i - 1] if i else " "
            after = blob[i + len(name) : i + len(name) + 1] or " "
            if not (before.isalnum() or before in "_-") and not (
                after.isalnum() or after in "_-"
            ):
                return True
            i = blob.find(name, i + 1)
        return False

    def flag(self, flag: str) -> Optional[str]:
        if flag in EXTERNAL_FLAGS or flag in EXTERNAL_NAMES or self._in_code(flag):
            return None
        field = flag[2:].replace("-", "_")
        if field in self.index.defined:  # a ServerArgs field (argparse built from it)
            return None
        return f"flag {flag}: not in the code"

    def env(self, name: str) -> Optional[str]:
        if name in EXTERNAL_ENV or self._in_code(name):
            return None
        return f"environment variable {name}: no code reads it"

    def metric(self, name: str) -> Optional[str]:
        m = re.match(r"^(.*)\{(.*)\}(.*)$", name)
        names = (
            [m.group(1) + x + m.group(3) for x in m.group(2).split(",")]
            if m
            else [name]
        )
        bad = []
        for n in names:
            base = re.sub(r"_(total|sum|count|bucket)$", "", n)
            if not (
                self._in_code(n)
                or self._in_code(base + '"')
                or self._in_code(base + "'")
            ):
                bad.append(n)
        return f"metric {', '.join(bad)}: not in the code" if bad else None

    def commit(self, sha: str) -> Optional[str]:
        if sha not in self._commits:
            r = subprocess.run(
                ["git", "-C", self.git_dir, "cat-file", "-e", sha + "^{commit}"],
                capture_output=True,
            )
            self._commits[sha] = r.returncode == 0
        return (
            None
            if self._commits[sha]
            else f"commit {sha}: not an object of this repository"
        )

    def link(self, doc: str, target: str) -> Optional[str]:
        if re.match(r"^[a-z]+:", target):
            return None
        path, _, anchor = target.partition("#")
        full = (
            os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
        )
        if not full.startswith(self.root + os.sep) and full != self.root:
            return f"link {target}: outside the repository"
        if not os.path.exists(full):
            return f"link {target}: no such file"
        if anchor and full.endswith(".md"):
            if full not in self._anchors:
                self._anchors[full] = anchors_of(full)
            if anchor not in self._anchors[full]:
                return f"link {target}: no heading #{anchor} in {os.path.relpath(full, self.root)}"
        return None

    def span(self, s: str) -> List[str]:
        s = s.strip()
        out: List[str] = []
        if "../" in s or s.startswith(("/work/", "shared/")):
            return [f"path {s}: outside the repository"]
        for f in _FLAG.findall(s):
            out.append(self.flag(f))
        for e in _ENV.findall(s):
            out.append(self.env(e))
        for m in _METRIC.findall(s):
            out.append(self.metric(m))
        if " " in s or _FLAG.search(s) or "sglang:" in s:
            return [x for x in out if x]
        call = _CALL.match(s)
        if call:
            name = call.group(1).split(".")[-1]
            if (
                call.group(1).split(".")[0] not in EXTERNAL_MODULES
                and name not in EXTERNAL_NAMES
                and name not in self.index.defined
            ):
                out.append(f"function {call.group(1)}(): not defined in the code")
        elif _PATCH_STEM.match(s) and not _FILE_EXT.search(s):
            if not os.path.exists(os.path.join(self.root, "patches", s + ".patch")):
                out.append(f"patch {s}: not in patches/")
        elif _FILE_EXT.search(s) or ("/" in s and _PATHLIKE.match(s)):
            last = s.rstrip("/").rsplit("/", 1)[-1]
            if (
                not _placeholder(s)
                and not re.match(r"^\.\w+$", s)
                and not s.startswith((".cache/", "out/", "/", "~"))
                and s not in EXTERNAL_NAMES
                and not self.index.has_path(s)
                and not os.path.exists(os.path.join(self.root, s))
                and not self._names_file(last)  # a file the code writes or reads
            ):
                out.append(f"path {s}: no such file, and no code names it")
        elif _DOTTED.match(s):
            parts = s.split(".")
            if (
                parts[0] not in EXTERNAL_MODULES
                and parts[-1] not in self.index.words
                and parts[-1] not in EXTERNAL_NAMES
            ):
                out.append(f"name {s}: {parts[-1]} is not in the code")
        elif _SNAKE.match(s) or _CAMEL.match(s):
            if s not in self.index.words and s not in EXTERNAL_NAMES:
                out.append(f"name {s}: not in the code")
        return [x for x in out if x]

    def block_line(self, line: str) -> List[str]:
        out = []
        if "../shared" in line:
            out.append("path ../shared: outside the repository")
        for f in _FLAG.findall(line):
            out.append(self.flag(f))
        for e in _ENV.findall(line):
            out.append(self.env(e))
        for m in _METRIC.findall(line):
            out.append(self.metric(m))
        return [x for x in out if x]

    def check_doc(self, doc: str) -> List[str]:
        with open(doc, encoding="utf-8") as fh:
            text = fh.read()
        rel = os.path.relpath(doc, self.root)
        problems: List[str] = []
        spans, block = split_doc(text)
        for n, s in spans:
            problems += [f"{rel}:{n}: {p}" for p in self.span(s)]
        for n, line in block:
            problems += [f"{rel}:{n}: {p}" for p in self.block_line(line)]
        for n, line in enumerate(text.splitlines(), 1):
            for target in _LINK.findall(line):
                p = self.link(doc, target)
                if p:
                    problems.append(f"{rel}:{n}: {p}")
            if "../shared" in line and "`" not in line:
                problems.append(f"{rel}:{n}: path ../shared: outside the repository")
            for sha in _COMMIT.findall(line):
                p = self.commit(sha)
                if p:
                    problems.append(f"{rel}:{n}: {p}")
        return sorted(
            set(problems), key=lambda p: (p.split(":")[0], int(p.split(":")[1]))
        )


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "files",
        nargs="*",
        help="markdown files (default: README.md, docs/*.md, every README.md)",
    )
    p.add_argument(
        "--tree",
        default=DEFAULT_TREE,
        help="the patched SGLang tree in repository layout",
    )
    p.add_argument("--root", default=ROOT, help="the repository to check against")
    args = p.parse_args(argv)
    root = os.path.abspath(args.root)
    if not os.path.isdir(os.path.join(args.tree, "python", "sglang")):
        print(
            f"check_docs: no patched SGLang tree at {args.tree} (make setup builds it)",
            file=sys.stderr,
        )
        return 2
    files = [os.path.abspath(f) for f in args.files] or doc_files(root)
    for f in files:
        if not os.path.isfile(f):
            print(f"check_docs: no such file: {f}", file=sys.stderr)
            return 2
    index = CodeIndex([(root, ""), (args.tree, "")])
    checker = Checker(index, root, root)
    problems: List[str] = []
    for f in files:
        problems += checker.check_doc(f)
    for line in problems:
        print(line)
    print(
        f"check_docs: {len(files)} file(s), {len(problems)} problem(s)", file=sys.stderr
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
