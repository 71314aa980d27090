"""Run every shell command the docs give, as a user would, in order.

    .venv/bin/python scripts/doc_commands.py [FILE.md ...]

Every command of the docs lives in a fenced ```bash block (an indented or
unlabelled block that holds a command is a problem), or in an inline code
span that starts with a program (`make demo`). Each doc's commands run in
the order the page gives them, each block in its own ``bash``, in a sandbox:

* ``/path/to/this/repo`` is a copy of this repository made of links (its own
  ``scripts/``, ``patches/`` and empty ``out/``, so nothing a command writes
  reaches the checkout; ``.cache/wheels/`` holds a stand-in 0.5.23 wheel of
  the files the series touches) and the commands start there; ``/tmp/`` is
  the sandbox's; ``/path/to/sglang`` is a plain SGLang 0.5.23 checkout, and
  ``https://github.com/sgl-project/sglang`` clones one: a git repository of
  SGLang's layout holding the files the series touches, taken from the 0.5.23
  wheel in ``.cache/wheels/``, tagged ``v0.5.23``; the repository copy is a
  git checkout of a private clone of this one, so a ``git clone`` of it
  clones this checkout's committed HEAD;
* ``HOME`` is empty and git has no identity, as in a fresh container;
* ``git``, ``sed`` and the shell's own commands run for real, and so do
  ``scripts/series.py`` (every subcommand) on trees under the sandbox's
  ``/tmp/`` that exist, and ``python -m zipfile -e`` into it;
  ``series.py`` output that tells the user to revert and apply again is a
  problem;
* other ``python``/``python3``/``.venv/bin/python``, ``torchrun``, ``make``
  and ``bash`` commands are checked, not run (the GPU runs, the benchmarks
  and ``make test`` take minutes to hours): the script or module exists
  where the command runs, every option is one its ``--help`` lists, every
  server flag after ``--`` or of ``sglang.launch_server`` is one SGLang 0.5.23
  with the series defines, every ``PYTHONPATH`` entry and pytest path
  exists, every path the command reads (``--target``, ``--onto``,
  ``--a-target``, ``--model-path`` ...) exists or was written by an earlier
  checked command of the page (``--out``, ``--out-dir``, ``pip download
  -d`` ...), a ``-c`` program compiles, and a ``make`` target is the
  Makefile's and ``make -n`` accepts it. Substitutions (``$(...)``) are
  evaluated by bash where the command runs, so what they expand to is what
  gets checked;
* a ``/tmp/NAME`` a page uses must be made by an earlier line of the page
  (``git clone``, ``zipfile -e``, ``mkdir``, ``--out`` ...) or by the section
  of another doc the page links to (a documented precondition), whose blocks
  then run first;
* any other program is not found, so a doc cannot give a command no test
  checks.

A block fails when ``bash -n`` rejects it, when it exits non-zero, or when a
checked program reports a problem. Prints one line per problem (with the
block's output tail) and exits 1 if there is one.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import check_docs  # noqa: E402

SERIES_TREE = os.path.join(ROOT, ".cache", "trees", "sglang-0.5.23-series-repo")
WHEEL = os.path.join(
    ROOT, ".cache", "wheels", "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl"
)
UPSTREAM_URL = "https://github.com/sgl-project/sglang"
SHELL_LANGS = {"bash", "sh", "shell", "console"}
# Programs that run for real in the sandbox (besides bash's builtins).
REAL_PROGRAMS = (
    "git sed cat ls mkdir rm cp mv echo env test true false head tail grep "
    "mktemp dirname basename readlink du wc sort uniq tr xargs tee timeout "
    "printf sleep id uname nproc"
).split()
# Programs that are checked, not run.
CHECKED = ("python", "python3", "python3.11", "torchrun", "make", "bash")
# GPU tools: accepted as they are (no GPU here to ask).
GPU_TOOLS = ("nvidia-smi", "rocm-smi", "amd-smi")
_PROGRAM = r"(?:\.venv/bin/python|python3?(?:\.\d+)?|make|git|bash|torchrun|timeout|pip3?|nvidia-smi|rocm-smi|amd-smi|cd)"
_COMMAND_SPAN = re.compile(rf"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)*{_PROGRAM}\s+\S")
# In prose, a span is a command when it runs one of this repository's tools or
# a make target: `git apply` in a sentence names what a tool does.
_INLINE_COMMAND = re.compile(
    r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:timeout \S+ )?"
    r"(?:(?:\.venv/bin/python|python3?|torchrun)\s+(?:-[mc]\s|\S+\.pyz?\b)|make [a-z])"
)
_FENCE = re.compile(r"^\s*(```|~~~)\s*([\w+-]*)")
BASH = shutil.which("bash", path="/usr/bin:/bin") or "/bin/bash"
# A reader runs a block line by line and stops at the first failure.
PRELUDE = (
    "set -eo pipefail; trap 'echo \"doc-commands: the block stopped at its line "
    "$((LINENO - 1)) (exit $?)\" >&2' ERR\n"
)


@dataclass
class Block:
    doc: str  # relative path
    line: int
    text: str
    inline: bool = False


@dataclass
class Report:
    problems: List[str] = field(default_factory=list)
    blocks: int = 0
    commands: int = 0  # checked-program invocations recorded by the shims


def doc_files() -> List[str]:
    try:
        out = subprocess.run(
            ["git", "-C", ROOT, "ls-files", "*.md"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        files = [os.path.join(ROOT, f) for f in out]
    except (OSError, subprocess.CalledProcessError):
        files = check_docs.doc_files(ROOT)
    return [f for f in files if os.path.isfile(f)]


def extract(path: str) -> tuple[List[Block], List[str]]:
    """The doc's command blocks and inline commands, and layout problems."""
    rel = os.path.relpath(path, ROOT)
    blocks: List[Block] = []
    problems: List[str] = []
    lines = open(path, encoding="utf-8").read().splitlines()
    fence: Optional[str] = None
    lang = ""
    start = 0
    body: List[str] = []
    prev_blank = True
    indented = None
    for n, line in enumerate(lines, 1):
        m = _FENCE.match(line)
        if fence is None and m:
            fence, lang, start, body = m.group(1), m.group(2).lower(), n, []
            if not lang:
                problems.append(
                    f"{rel}:{n}: code block without a language (```bash for commands, ```text for output)"
                )
            continue
        if fence is not None:
            if line.strip().startswith(fence):
                if lang in SHELL_LANGS:
                    blocks.append(Block(rel, start, "\n".join(body)))
                fence = None
            else:
                body.append(line)
            continue
        if line.startswith("    ") and prev_blank:
            # An indented code block: checked like a bash block when it
            # holds a command, and reported, since it should be one.
            if indented is None:
                indented = (n, [])
            indented[1].append(line[4:])
        elif indented is not None and (line.strip() or True):
            _close_indented(rel, indented, blocks, problems)
            indented = None
        prev_blank = not line.strip() or (prev_blank and line.startswith("    "))
        for span in check_docs._INLINE.findall(line):
            if _INLINE_COMMAND.match(span.strip()):
                blocks.append(Block(rel, n, span.strip(), inline=True))
    if indented is not None:
        _close_indented(rel, indented, blocks, problems)
    return blocks, problems


def _close_indented(rel, indented, blocks, problems) -> None:
    start, body = indented
    while body and not body[-1].strip():
        body.pop()
    if body and _COMMAND_SPAN.match(body[0].strip()):
        problems.append(
            f"{rel}:{start}: an indented command: put it in a ```bash block"
        )
        blocks.append(Block(rel, start, "\n".join(body)))


# ------------------------------------------------------------------ sandbox


def _touched_files() -> List[str]:
    """Repository paths of the upstream files the series modifies."""
    created, touched = set(), set()
    for name in _series_names():
        path = None
        for line in open(os.path.join(ROOT, "patches", name), encoding="utf-8"):
            m = re.match(r"^diff --git a/(\S+) b/(\S+)$", line)
            if m:
                path = m.group(2)
                touched.add(path)
            elif path and line.startswith("new file mode"):
                created.add(path)
    return sorted(touched - created)


def _series_names() -> List[str]:
    with open(os.path.join(ROOT, "patches", "series"), encoding="utf-8") as fh:
        return [x.strip() for x in fh if x.strip() and not x.strip().startswith("#")]


GIT_ID = [
    "-c",
    "user.name=doc-commands",
    "-c",
    "user.email=doc-commands@example.invalid",
]


def make_upstream(dest: str) -> str:
    """A git repository of SGLang's layout at 0.5.23: the files the series
    touches (and version.py) from the wheel, an empty test/, tag v0.5.23."""
    os.makedirs(os.path.join(dest, "test"))
    with open(os.path.join(dest, "test", ".gitkeep"), "w"):
        pass
    wanted = {p.removeprefix("python/") for p in _touched_files()}
    wanted |= {"sglang/version.py", "sglang/__init__.py"}
    with zipfile.ZipFile(WHEEL) as whl:
        for name in wanted & set(whl.namelist()):
            whl.extract(name, os.path.join(dest, "python"))
    env = _git_env(None)
    for cmd in (
        ["init", "-q", "-b", "main"],
        ["add", "-A"],
        ["commit", "-q", "-m", "SGLang 0.5.23 (the files the series touches)"],
        ["tag", "v0.5.23"],
    ):
        subprocess.run(["git", *GIT_ID, *cmd], cwd=dest, env=env, check=True)
    return dest


_SHARED: Dict[str, str] = {}


def _shared_upstream() -> str:
    """The stand-in SGLang checkout, with the stand-in wheel beside it, built
    once per process: every sandbox only reads them."""
    if "upstream" not in _SHARED:
        base = tempfile.mkdtemp(prefix="doc-commands-upstream-")
        atexit.register(shutil.rmtree, base, True)
        make_wheel(os.path.join(base, os.path.basename(WHEEL)))
        _SHARED["upstream"] = make_upstream(os.path.join(base, "upstream"))
    return _SHARED["upstream"]


def make_wheel(dest: str) -> str:
    """A stand-in for the 0.5.23 wheel: the same names, only the files the
    series touches (and the package's version), so extracting and importing
    it take seconds."""
    wanted = {p.removeprefix("python/") for p in _touched_files()}
    wanted |= {"sglang/version.py", "sglang/__init__.py"}
    with zipfile.ZipFile(WHEEL) as whl, zipfile.ZipFile(dest, "w") as out:
        for name in sorted(wanted & set(whl.namelist())):
            out.writestr(name, whl.read(name))
    return dest


def _git_env(sandbox: Optional[str]) -> Dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "GIT_CONFIG_NOSYSTEM": "1",
        "HOME": sandbox or tempfile.gettempdir(),
        "LANG": "C.UTF-8",
    }
    if sandbox is None:
        env["GIT_CONFIG_GLOBAL"] = os.devnull
    return env


SHIM = """#!{python}
import sys
sys.path.insert(0, {scripts!r})
import doc_commands
sys.exit(doc_commands.shim({role!r}, sys.argv[1:]))
"""


class Sandbox:
    """One doc's world: a linked copy of the repository, /tmp, an SGLang
    checkout, no git identity, and the checked programs on PATH."""

    def __init__(self, base: str, upstream: str):
        self.base = base
        self.upstream = upstream
        self.repo = os.path.join(base, "repo")
        self.bin = os.path.join(base, "bin")
        self.log = os.path.join(base, "shim.log")
        self.docs = 0
        for d in (self.repo, self.bin):
            os.makedirs(d)
        for name in os.listdir(ROOT):
            if name in (".git", ".venv", "out", ".cache", "scripts", "patches"):
                continue
            os.symlink(os.path.join(ROOT, name), os.path.join(self.repo, name))
        os.makedirs(os.path.join(self.repo, "out"))
        # Real copies: series.py finds patches/ beside its own file, and
        # export writes there.
        for name in ("scripts", "patches"):
            shutil.copytree(
                os.path.join(ROOT, name),
                os.path.join(self.repo, name),
                ignore=shutil.ignore_patterns("__pycache__"),
            )
        cache = os.path.join(self.repo, ".cache")
        os.makedirs(os.path.join(cache, "wheels"))
        for name in os.listdir(os.path.join(ROOT, ".cache")):
            if name != "wheels":
                os.symlink(
                    os.path.join(ROOT, ".cache", name), os.path.join(cache, name)
                )
        shutil.copy(
            os.path.join(os.path.dirname(upstream), os.path.basename(WHEEL)),
            os.path.join(cache, "wheels", os.path.basename(WHEEL)),
        )
        # The sandbox's repository is a git checkout of its own (a private
        # clone of this one's commits), so a clean-clone recipe clones it and
        # no doc's git command reaches this checkout.
        private = os.path.join(base, "git")
        subprocess.run(
            ["git", "clone", "-q", "--no-checkout", ROOT, private],
            env=_git_env(None),
            check=True,
            capture_output=True,
        )
        with open(os.path.join(self.repo, ".git"), "w") as fh:
            fh.write(f"gitdir: {os.path.join(private, '.git')}\n")
        os.makedirs(os.path.join(self.repo, ".venv", "bin"))
        self._shim(os.path.join(self.repo, ".venv", "bin", "python"), "python")
        for prog in CHECKED:
            self._shim(os.path.join(self.bin, prog), prog)
        for prog in GPU_TOOLS:
            self._shim(os.path.join(self.bin, prog), "gpu-tool")
        for prog in REAL_PROGRAMS:
            real = shutil.which(prog)
            if real:
                os.symlink(real, os.path.join(self.bin, prog))
        gitconfig = os.path.join(base, "gitconfig")
        with open(gitconfig, "w") as fh:
            fh.write(f'[url "{upstream}"]\n\tinsteadOf = {UPSTREAM_URL}\n')
        self.gitconfig = gitconfig

    def new_doc(self, text: str) -> None:
        """A fresh /tmp, HOME and SGLang checkout for the next doc."""
        self.docs += 1
        doc = os.path.join(self.base, f"doc{self.docs}")
        self.tmp = os.path.join(doc, "tmp")
        self.home = os.path.join(doc, "home")
        self.sglang = os.path.join(doc, "sglang")
        os.makedirs(self.tmp)
        os.makedirs(self.home)
        self.made = os.path.join(doc, "made.txt")
        open(self.made, "w").close()
        if "/path/to/sglang" in text:
            subprocess.run(
                ["git", "clone", "-q", self.upstream, self.sglang],
                env=self.env(),
                check=True,
                capture_output=True,
            )

    def _shim(self, path: str, role: str) -> None:
        with open(path, "w") as fh:
            fh.write(
                SHIM.format(
                    python=sys.executable,
                    scripts=os.path.join(ROOT, "scripts"),
                    role=role,
                )
            )
        os.chmod(path, 0o755)

    def env(self) -> Dict[str, str]:
        return {
            "PATH": self.bin,
            "HOME": getattr(self, "home", self.base),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": self.gitconfig,
            "LANG": "C.UTF-8",
            "DOC_SANDBOX": self.base,
            "DOC_TMP": getattr(self, "tmp", self.base),
            "DOC_REPO": self.repo,
            "DOC_SHIM_LOG": self.log,
            "DOC_REAL_PYTHON": sys.executable,
            "DOC_WORK": self.base,
            "DOC_MADE": getattr(self, "made", os.devnull),
            "TMPDIR": getattr(self, "tmp", self.base),
        }

    def localise(self, text: str) -> str:
        text = re.sub(r"(?<![\w./-])/tmp/", self.tmp + "/", text)
        text = text.replace("/path/to/this/repo", self.repo)
        return text.replace("/path/to/sglang", self.sglang)


def run_block(box: Sandbox, block: Block, timeout: int = 120) -> List[str]:
    where = f"{block.doc}:{block.line}"
    script = box.localise(block.text)
    syntax = subprocess.run([BASH, "-n", "-c", script], capture_output=True, text=True)
    if syntax.returncode:
        return [f"{where}: bash -n: {syntax.stderr.strip()}"]
    open(box.log, "w").close()
    try:
        proc = subprocess.run(
            [BASH, "-c", PRELUDE + script],
            cwd=box.repo,
            env=box.env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        rc, out = proc.returncode, (proc.stdout + proc.stderr)
    except subprocess.TimeoutExpired as exc:
        rc, out = "timeout", f"ran past {timeout} s: {exc}"
    problems = []
    with open(box.log) as fh:
        for line in fh:
            rec = json.loads(line)
            for p in rec["problems"]:
                problems.append(f"{where}: {rec['argv'][0]}: {p}")
    if rc != 0:
        tail = "\n    ".join(
            out.strip().replace(box.base, "$SANDBOX").splitlines()[-24:]
        )
        problems.append(
            f"{where}: exit status {rc}; the block:\n    "
            + "\n    ".join(block.text.splitlines())
            + f"\n  its output's tail:\n    {tail}"
        )
    return problems


def check(files: Optional[List[str]] = None, work: Optional[str] = None) -> Report:
    report = Report()
    files = files or doc_files()
    own = work is None
    work = work or tempfile.mkdtemp(prefix="doc-commands-")
    try:
        upstream = _shared_upstream()
        box = Sandbox(os.path.join(work, "sandbox"), upstream)
        for path in files:
            blocks, problems = extract(path)
            report.problems += problems
            if not blocks:
                continue
            pre, unmade = preconditions(path, blocks)
            report.problems += unmade
            box.new_doc("\n".join(b.text for b in pre + blocks))
            for block in pre + blocks:
                report.blocks += 1
                report.problems += run_block(box, block)
                with open(box.log) as fh:
                    report.commands += sum(1 for _ in fh)
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)
    return report


_TMP_PATH = re.compile(r"(?<![\w./-])/tmp/[\w.-]+")
# How a line makes a /tmp/NAME that later lines use.
_MAKES = [
    re.compile(p)
    for p in (
        r"\bgit clone\b.*?\s(/tmp/[\w.-]+)",
        r"\bzipfile -e \S+ (/tmp/[\w.-]+)",
        r"\bmkdir (?:-p )?(/tmp/[\w.-]+)",
        r"--(?:out|out-dir|workdir|out-json|out-md)[ =](/tmp/[\w.-]+)",
        r"\s-d (/tmp/[\w.-]+)",
        r">\s*(/tmp/[\w.-]+)",
    )
]


def made_and_used(blocks: List[Block]):
    """The /tmp paths the blocks make, and each use of one (block, path)
    before a line made it, in the order a reader runs them."""
    made: set = set()
    unmade = []
    for b in blocks:
        for line in b.text.splitlines():
            makes = {m.group(1) for r in _MAKES for m in r.finditer(line)}
            unmade += [(b, u) for u in _TMP_PATH.findall(line) if u not in made | makes]
            made |= makes
    return made, unmade


def section_blocks(path: str, anchor: str) -> List[Block]:
    """The command blocks under the heading ANCHOR of PATH, down to the next
    heading of the same or a higher level."""
    lines = open(path, encoding="utf-8").read().splitlines()
    seen: Dict[str, int] = {}
    start = end = None
    level = 0
    in_fence = False
    for n, line in enumerate(lines, 1):
        if _FENCE.match(line):
            in_fence = not in_fence
        if in_fence or not line.startswith("#"):
            continue
        depth = len(line) - len(line.lstrip("#"))
        a = check_docs.github_anchor(line.lstrip("#"))
        k = seen.get(a, 0)
        seen[a] = k + 1
        if start is not None and depth <= level:
            end = n
            break
        if start is None and (a if k == 0 else f"{a}-{k}") == anchor:
            start, level = n, depth
    if start is None:
        return []
    blocks, _ = extract(path)
    return [
        b for b in blocks if not b.inline and start < b.line < (end or len(lines) + 1)
    ]


def preconditions(path: str, blocks: List[Block]):
    """Blocks of the sections of other docs the page links to that make a
    /tmp path the page uses without making it (they run first), and one
    problem per path that neither the page nor such a section makes."""
    _, unmade = made_and_used(blocks)
    missing = {u for _, u in unmade}
    pre: List[Block] = []
    if missing:
        text = open(path, encoding="utf-8").read()
        for target in check_docs._LINK.findall(text):
            file, _, anchor = target.partition("#")
            if not anchor or not file.endswith(".md") or re.match(r"^[a-z]+:", file):
                continue
            full = os.path.normpath(os.path.join(os.path.dirname(path), file))
            if full == os.path.normpath(path) or not os.path.isfile(full):
                continue
            sec = section_blocks(full, anchor)
            sec_made, _ = made_and_used(sec)
            if sec_made & missing:
                pre += [b for b in sec if b not in pre]
                missing -= sec_made
    problems, told = [], set()
    for b, u in unmade:
        if u in missing and u not in told:
            told.add(u)
            problems.append(
                f"{b.doc}:{b.line}: uses {u}, which no earlier step of the page "
                "and no recipe it links to makes"
            )
    return pre, problems


# -------------------------------------------------------------------- shims


def _cached(name: str, compute):
    """A value computed once per check run (in the work folder), not per shim."""
    path = os.path.join(
        os.environ.get("DOC_WORK", tempfile.gettempdir()), name + ".json"
    )
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        value = compute()
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w") as fh:
            json.dump(value, fh)
        os.replace(tmp, path)
        return value


def _server_flags() -> set:
    return set(_cached("server_flags", lambda: sorted(_server_flags_now())))


def _server_flags_now() -> set:
    """Every flag SGLang's ServerArgs defines in the patched tree."""
    srt = os.path.join(SERIES_TREE, "python", "sglang", "srt")
    flags = set()
    texts = [os.path.join(srt, "server_args.py")]
    for d, _, files in os.walk(os.path.join(srt, "arg_groups")):
        texts += [os.path.join(d, f) for f in files if f.endswith(".py")]
    for t in texts:
        text = open(t, encoding="utf-8").read()
        flags.update(re.findall(r"[\"'](--[a-z0-9][a-z0-9-]*)[\"']", text))
        if os.sep + "fields" + os.sep in t:
            flags.update(
                "--" + f.replace("_", "-")
                for f in re.findall(r"^\s+(\w+)\s*:", text, re.M)
            )
    return flags


def _help_options(
    real_python: str, script: str, args: List[str], cwd: str
) -> Optional[set]:
    """The options SCRIPT's --help lists (and its subcommand's, if any)."""
    key = re.sub(r"\W", "_", os.path.realpath(os.path.join(cwd, script)))
    if args and not args[0].startswith("-"):
        key += "__" + re.sub(r"\W", "_", args[0])
    found = _cached("help_" + key, lambda: _help_now(real_python, script, args, cwd))
    return None if found is None else set(found)


def _help_now(real_python: str, script: str, args: List[str], cwd: str):
    opts = set()
    runs = [[script, "--help"]]
    if args and not args[0].startswith("-"):
        runs.append([script, args[0], "--help"])
    ok = False
    for argv in runs:
        proc = subprocess.run(
            [real_python, *argv],
            cwd=cwd,
            capture_output=True,
            text=True,
            env={**os.environ, "PATH": "/usr/bin:/bin"},
        )
        if proc.returncode == 0:
            ok = True
            opts.update(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", proc.stdout))
    return sorted(opts) if ok else None


def _pythonpath_problems(env) -> List[str]:
    out = []
    for entry in filter(None, env.get("PYTHONPATH", "").split(":")):
        if not os.path.isdir(entry):
            out.append(f"PYTHONPATH entry {entry} does not exist")
    return out


def _flag_problems(flags: List[str], known: set, what: str) -> List[str]:
    out = []
    for a in flags:
        if a.startswith("--") and len(a) > 2:
            name = a.split("=", 1)[0]
            if name not in known:
                out.append(f"{what} {name} is not defined")
    return out


def _check_script(script: str, args: List[str], cwd: str, env) -> List[str]:
    real_python = env["DOC_REAL_PYTHON"]
    if script.startswith("out/") and _named_by_code(os.path.basename(script)):
        return []  # an archive a checked (not run) command of the doc builds
    if not os.path.isfile(os.path.join(cwd, script)):
        return [f"no script {script} in {cwd}"]
    own, server = args, []
    if "--" in args:
        i = args.index("--")
        own, server = args[:i], args[i + 1 :]
    problems = []
    opts = _help_options(real_python, script, own, cwd)
    if opts is None and any(a.startswith("-") for a in own):
        problems.append(f"{script} --help failed, so its options cannot be checked")
    elif opts is None:
        try:  # positional arguments only: the script must at least compile
            compile(
                open(os.path.join(cwd, script), encoding="utf-8").read(), script, "exec"
            )
        except SyntaxError as exc:
            problems.append(f"{script} does not compile: {exc}")
    else:
        problems += _flag_problems(own, opts, f"{script}: option")
    if server:
        problems += _flag_problems(server, _server_flags(), "server flag")
    problems += _path_problems(*_option_paths(args), cwd, env)
    return problems


def _named_by_code(name: str) -> bool:
    for d in ("benchmark", "scripts", "demo", "cpu_support"):
        for base, _, files in os.walk(os.path.join(ROOT, d)):
            for f in files:
                if (
                    f.endswith(".py")
                    and name in open(os.path.join(base, f), encoding="utf-8").read()
                ):
                    return True
    return False


def _check_module(mod: str, args: List[str], cwd: str, env) -> List[str]:
    if mod == "pytest":
        out = []
        for a in args:
            if a.startswith("-") or "=" in a:
                continue
            path = a.split("::")[0]
            if "/" in path or path.endswith(".py"):
                if not os.path.exists(os.path.join(cwd, path)):
                    out.append(f"pytest path {path} does not exist")
        if not any(not a.startswith("-") for a in args) and "-q" in args and False:
            out.append("pytest got no path")
        return out
    if mod == "zipfile" and args[:1] == ["-e"] and len(args) == 3:
        return _path_problems([("zipfile -e", args[1])], [args[2]], cwd, env)
    if mod == "pip":
        return _path_problems([], _option_paths(args)[1], cwd, env)
    if mod in ("zipfile", "venv", "compileall"):
        return []
    if mod.startswith("sglang."):
        roots = [p for p in env.get("PYTHONPATH", "").split(":") if p] + [
            os.path.join(SERIES_TREE, "python")
        ]
        rel = mod.replace(".", "/")
        if not any(
            os.path.isfile(os.path.join(r, rel + ".py"))
            or os.path.isfile(os.path.join(r, rel, "__main__.py"))
            for r in roots
        ):
            return [f"no module {mod}"]
        if mod == "sglang.launch_server":
            return _flag_problems(
                args, _server_flags(), "server flag"
            ) + _path_problems(*_option_paths(args), cwd, env)
        return []
    return [f"no check for python -m {mod}"]


def _python(args: List[str], cwd: str, env) -> List[str]:
    problems = _pythonpath_problems(env)
    while args and args[0] in ("-u", "-S", "-s", "-B", "-E", "-I"):
        args = args[1:]
    while args and args[0] == "-X":
        args = args[2:]
    if not args:
        return problems + ["an interactive python: no command"]
    if args[0] in ("--version", "-V"):
        return problems
    if args[0] == "-c":
        try:
            compile(args[1], "<-c>", "exec")
        except (SyntaxError, IndexError) as exc:
            problems.append(f"-c program does not compile: {exc}")
        return problems
    if args[0] == "-m":
        return problems + _check_module(args[1], args[2:], cwd, env)
    return problems + _check_script(args[0], args[1:], cwd, env)


SERIES_COMMANDS = ("check", "status", "apply", "revert", "import", "export", "rebase")
# Options whose value is a path the command reads, or one it writes.
READ_OPTS = (
    "--target",
    "--onto",
    "--a-target",
    "--b-target",
    "--sglang-target",
    "--model-path",
    "--build",
)
WRITE_OPTS = ("--out", "--out-dir", "--workdir", "--out-json", "--out-md", "-d")


def _in_tmp(path: str, cwd: str, env) -> bool:
    full = os.path.abspath(os.path.join(cwd, path))
    return full.startswith(env["DOC_TMP"] + os.sep)


def _runs_for_real(args: List[str], cwd: str, env) -> bool:
    """scripts/series.py on trees inside the sandbox's /tmp that exist, and
    ``python -m zipfile -e`` of a file that exists into it, run for real."""
    if args[:3] == ["-m", "zipfile", "-e"] and len(args) == 5:
        return os.path.isfile(os.path.join(cwd, args[3])) and _in_tmp(args[4], cwd, env)
    if not args or os.path.normpath(args[0]) != "scripts/series.py":
        return False
    if len(args) < 2 or args[1] not in SERIES_COMMANDS:
        return False
    trees = [
        args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--target", "--onto")
    ]
    return bool(trees) and all(
        _in_tmp(t, cwd, env) and os.path.isdir(os.path.join(cwd, t)) for t in trees
    )


def _made(env) -> List[str]:
    try:
        with open(env["DOC_MADE"]) as fh:
            return [x for x in fh.read().splitlines() if x]
    except OSError:
        return []


def _path_problems(reads: List[tuple], writes: List[str], cwd: str, env) -> List[str]:
    """Each path a checked command reads exists or an earlier checked command
    of the page writes it; record what this one writes."""
    made = _made(env)
    out = []
    for opt, value in reads:
        if not value or (opt == "--model-path" and not value.startswith(("/", "."))):
            continue  # a Hugging Face id, or a substitution the sandbox left empty
        full = os.path.abspath(os.path.join(cwd, value))
        if not os.path.exists(full) and not any(
            full == m or full.startswith(m + os.sep) for m in made
        ):
            out.append(
                f"{opt} {value}: no such path, and no earlier step of the page makes it"
            )
    if writes and env.get("DOC_MADE"):
        with open(env["DOC_MADE"], "a") as fh:
            for w in writes:
                fh.write(os.path.abspath(os.path.join(cwd, w)) + "\n")
    return out


def _option_paths(args: List[str]):
    """(reads, writes): the values of READ_OPTS and WRITE_OPTS in ARGS."""
    reads, writes = [], []
    for i, a in enumerate(args):
        name, eq, value = a.partition("=")
        if eq and name.startswith("--"):
            opt = name
        elif i + 1 < len(args):
            opt, value = a, args[i + 1]
        else:
            continue
        if opt in READ_OPTS:
            if opt == "--build":
                value = value.partition("=")[2]
            reads.append((opt, value))
        elif opt in WRITE_OPTS:
            writes.append(value)
    return reads, writes


def _make(args: List[str], cwd: str, env) -> List[str]:
    if os.path.realpath(cwd) != os.path.realpath(env["DOC_REPO"]):
        return [f"make runs in {cwd}, not the repository root"]
    targets = [a for a in args if not a.startswith("-")]
    makefile = open(os.path.join(ROOT, "Makefile"), encoding="utf-8").read()
    defined = set(re.findall(r"^([\w-]+):", makefile, re.M))
    out = [
        f"make target {t} is not in the Makefile" for t in targets if t not in defined
    ]
    if not out:
        proc = subprocess.run(
            ["/usr/bin/make", "-n", "-C", ROOT, *targets],
            capture_output=True,
            text=True,
        )
        if proc.returncode:
            out.append(f"make -n {' '.join(targets)} failed: {proc.stderr.strip()}")
    return out


def shim(role: str, args: List[str]) -> int:
    env, cwd = os.environ, os.getcwd()
    problems: List[str] = []
    real = False
    if role.startswith("python") and _runs_for_real(args, cwd, env):
        real = True
    elif role in ("python", "python3", "python3.11"):
        problems = _python(args, cwd, env)
    elif role == "torchrun":
        rest = list(args)
        while rest and rest[0].startswith("--"):
            rest = rest[1:] if "=" in rest[0] else rest[2:]
        problems = _pythonpath_problems(env) + (
            _check_script(rest[0], rest[1:], cwd, env) if rest else ["no script"]
        )
    elif role == "make":
        problems = _make(args, cwd, env)
    elif role == "bash":
        # A script of this repository: it exists and bash parses it.
        if not args or not os.path.isfile(os.path.join(cwd, args[0])):
            problems = [f"no script {args[0] if args else ''} in {cwd}"]
        elif subprocess.run([BASH, "-n", os.path.join(cwd, args[0])]).returncode:
            problems = [f"bash -n rejects {args[0]}"]
    rc = None
    if real:
        proc = subprocess.run(
            [env["DOC_REAL_PYTHON"], *args],
            env={**env, "PATH": env["PATH"] + ":/usr/bin:/bin"},
            capture_output=True,
            text=True,
        )
        sys.stdout.write(proc.stdout)
        sys.stderr.write(proc.stderr)
        rc = proc.returncode
        if "run `series.py revert`" in proc.stdout + proc.stderr:
            problems.append(
                f"{' '.join(args)} tells the user to revert and apply again: "
                + next(
                    x.strip()
                    for x in (proc.stdout + proc.stderr).splitlines()
                    if "series.py revert" in x
                )
            )
    with open(env["DOC_SHIM_LOG"], "a") as fh:
        fh.write(
            json.dumps({"argv": [role, *args], "cwd": cwd, "problems": problems}) + "\n"
        )
    if rc is not None:
        return rc
    for p in problems:
        print(f"doc-commands: {p}", file=sys.stderr)
    return 1 if problems else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "files", nargs="*", help="markdown files (default: every tracked *.md)"
    )
    a = p.parse_args(argv)
    report = check([os.path.abspath(f) for f in a.files] or None)
    for line in report.problems:
        print(line)
    print(
        f"doc_commands: {report.blocks} block(s), {report.commands} checked command(s), "
        f"{len(report.problems)} problem(s)",
        file=sys.stderr,
    )
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
