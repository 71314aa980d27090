"""Which model classes' encoders the DP encoder spreads: a row per such class.

Every class under SGLang's ``srt/models/`` (subfolders included) that defines
or inherits ``get_image_feature``, ``get_video_feature`` or
``get_audio_feature`` is listed: a class the DP encoder spreads gets a
markdown row of its own, the others are named in a second table, one row per
set of cells. Per modality: whether ROCm batches its items across requests
under ``--mm-enable-dp-encoder`` (the class's
answer to ``dp_encoder_spreads_images``, as its MRO finds it, which the gate
``mm_schedule._batch_vit_across_requests`` asks), that answer as written, and
its vision warm-up (the ``warm_up_vision_tower`` call of its
``precompile_kernels_after_loading``, own or inherited: the tower, the calls
and the call function it hands over).

The model files are parsed with ``ast``, never imported (many import GPU-only
code); base classes are resolved by name across the files under ``models/``
(through each file's imports; a base found by its name alone, or not found
although models/ has that name, is reported on stderr as a note).

    .venv/bin/python scripts/dp_encoder_table.py --out docs/warmup.md
    .venv/bin/python scripts/dp_encoder_table.py --check docs/warmup.md

``--out FILE`` writes the table block to a new FILE, or replaces the block
between the table markers of an existing one; ``--out -`` prints it.
``--check FILE`` compares the rows between the table markers in FILE with a
fresh table and exits 1, one line per class, when a class is missing there,
its row differs, or FILE lists a class the tree no longer has.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import re
import shlex
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # cpu_support
    sys.path.insert(0, ROOT)

BEGIN = "<!-- dp-encoder-table:begin -->"
END = "<!-- dp-encoder-table:end -->"
FEATURES = ("get_image_feature", "get_video_feature", "get_audio_feature")
MODELS_PACKAGE = "sglang.srt.models"
COLUMNS = ("class", "file", "image", "video", "audio", "answer", "warm-up plan")
NO_METHOD = "—"
ANSWER = "dp_encoder_spreads_images"
WARM_UP = "warm_up_vision_tower"


# ---------------------------------------------------------------------------
# The model classes, from the source files
# ---------------------------------------------------------------------------


@dataclass(eq=False)  # compared by identity
class ModelClass:
    name: str
    path: str  # relative to models/, with "/" separators
    line: int
    bases: List[ast.expr]
    defines: Dict[str, bool]
    # Its own precompile_kernels_after_loading, if it defines one: the vision
    # warm-up that hook asks for, and whether it calls super()'s first.
    hook: Optional["WarmUpHook"] = None
    # What its own dp_encoder_spreads_images returns, as written (None: it
    # defines none).
    answer: Optional[str] = None
    resolved: List["Base"] = field(default_factory=list)


@dataclass(frozen=True)
class WarmUpHook:
    """A model class's own ``precompile_kernels_after_loading``, as written:
    the ``warm_up_vision_tower(self, <tower>, <calls>, <call>)`` call in it
    (the tower attribute, the calls expression and the call function, local
    names resolved through the hook's own assignments), and whether it calls
    ``super()``'s hook."""

    tower: Optional[str]
    calls: Optional[ast.expr]
    call: Optional[str]
    calls_super: bool


@dataclass(frozen=True)
class Base:
    """A base class as written: the class it names in models/, else its name."""

    name: str
    cls: Optional[ModelClass] = None


@dataclass
class ModelFile:
    path: str
    module: str
    classes: Dict[str, ModelClass]
    # local name -> (absolute module, imported name); name None: a module import.
    imports: Dict[str, Tuple[str, Optional[str]]]
    # module-level integer constants (grid repeat counts).
    constants: Dict[str, int]


def _module_level(body: Sequence[ast.stmt]):
    """Statements run at import: the module body and its if/try/with blocks."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.With, ast.For, ast.While)):
            yield from _module_level(node.body)
            yield from _module_level(getattr(node, "orelse", []))
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _module_level(block)
            for handler in node.handlers:
                yield from _module_level(handler.body)


def _absolute_module(module: Optional[str], level: int, own: str) -> str:
    if not level:
        return module or ""
    package = own.split(".")[:-level]
    return ".".join(package + ([module] if module else []))


def _class_defines(node: ast.ClassDef) -> Dict[str, bool]:
    """The encoder methods the class body binds: True for a method, False
    for one set to None (hidden from the subclass)."""
    bound: Dict[str, bool] = {}
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            bound[item.name] = True
        elif isinstance(item, (ast.Assign, ast.AnnAssign)) and item.value is not None:
            targets = item.targets if isinstance(item, ast.Assign) else [item.target]
            is_none = isinstance(item.value, ast.Constant) and item.value.value is None
            for target in targets:
                if isinstance(target, ast.Name):
                    bound[target.id] = not is_none
    return {name: bound[name] for name in FEATURES if name in bound}


def _own_answer(node: ast.ClassDef) -> Optional[str]:
    """What the class body's own ``dp_encoder_spreads_images`` returns."""
    for item in node.body:
        if isinstance(item, ast.FunctionDef) and item.name == ANSWER:
            returns = [r for r in ast.walk(item) if isinstance(r, ast.Return)]
            if returns and returns[0].value is not None:
                return ast.unparse(returns[0].value)
            return "None"
    return None


def _tower_name(expr: ast.expr) -> Optional[str]:
    """``self.visual`` and ``getattr(self, "visual", None)`` name ``visual``."""
    if isinstance(expr, ast.Attribute):
        return expr.attr
    if (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Name)
        and expr.func.id == "getattr"
        and len(expr.args) >= 2
        and isinstance(expr.args[1], ast.Constant)
    ):
        return expr.args[1].value
    return None


def _call_text(expr: ast.expr) -> str:
    """The call a hook hands the warm-up: a local function by name, or a
    helper call by its name and its string arguments (the rope type)."""
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Call):
        fn = expr.func
        name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "?")
        strings = [
            a.value
            for a in expr.args
            if isinstance(a, ast.Constant) and isinstance(a.value, str)
        ]
        return f"{name}({', '.join(strings)})" if strings else name
    return ast.unparse(expr)


def _warm_up_hook(node: ast.ClassDef) -> Optional[WarmUpHook]:
    """The class body's own ``precompile_kernels_after_loading``, or None when
    it defines none."""
    for item in node.body:
        if not (
            isinstance(item, ast.FunctionDef)
            and item.name == "precompile_kernels_after_loading"
        ):
            continue
        local: Dict[str, ast.expr] = {}
        for statement in ast.walk(item):
            if (
                isinstance(statement, ast.Assign)
                and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)
            ):
                local.setdefault(statement.targets[0].id, statement.value)

        def resolved(expr: ast.expr) -> ast.expr:
            if isinstance(expr, ast.Name) and expr.id in local:
                return local[expr.id]
            return expr

        tower = calls = call = None
        calls_super = False
        for found in ast.walk(item):
            if not isinstance(found, ast.Call):
                continue
            fn = found.func
            if isinstance(fn, ast.Name) and fn.id == WARM_UP and len(found.args) >= 3:
                tower = _tower_name(resolved(found.args[1]))
                calls = resolved(found.args[2])
                given = found.args[3] if len(found.args) > 3 else None
                for keyword in found.keywords:
                    if keyword.arg == "call":
                        given = keyword.value
                call = _call_text(given) if given is not None else None
            elif (
                isinstance(fn, ast.Attribute)
                and fn.attr == "precompile_kernels_after_loading"
                and isinstance(fn.value, ast.Call)
                and isinstance(fn.value.func, ast.Name)
                and fn.value.func.id == "super"
            ):
                calls_super = True
        return WarmUpHook(tower, calls, call, calls_super)
    return None


def parse_models(models_dir: str) -> Dict[str, ModelFile]:
    files: Dict[str, ModelFile] = {}
    for folder, subfolders, names in os.walk(models_dir):
        subfolders[:] = sorted(d for d in subfolders if d != "__pycache__")
        for name in sorted(names):
            if not name.endswith(".py"):
                continue
            full = os.path.join(folder, name)
            rel = os.path.relpath(full, models_dir).replace(os.sep, "/")
            parts = rel[: -len(".py")].split("/")
            if parts[-1] == "__init__":
                parts = parts[:-1]
            module = ".".join([MODELS_PACKAGE, *parts])
            with open(full, encoding="utf-8") as f:
                source = f.read()
            try:
                tree = ast.parse(source, filename=full)
            except SyntaxError as error:
                raise SystemExit(f"cannot parse models/{rel}: {error}") from None
            own = module if parts and name != "__init__.py" else module + ".x"
            files[rel] = ModelFile(rel, module, {}, {}, {})
            for node in _module_level(tree.body):
                if isinstance(node, ast.ClassDef):
                    files[rel].classes[node.name] = ModelClass(
                        node.name,
                        rel,
                        node.lineno,
                        node.bases,
                        _class_defines(node),
                        _warm_up_hook(node),
                        _own_answer(node),
                    )
                elif (
                    isinstance(node, ast.Assign)
                    and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name)
                    and isinstance(node.value, ast.Constant)
                    and type(node.value.value) is int
                ):
                    files[rel].constants[node.targets[0].id] = node.value.value
                elif isinstance(node, ast.ImportFrom):
                    source_module = _absolute_module(node.module, node.level, own)
                    for alias in node.names:
                        local = alias.asname or alias.name
                        files[rel].imports[local] = (source_module, alias.name)
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.asname:
                            files[rel].imports[alias.asname] = (alias.name, None)
    return files


class Resolver:
    """Finds the model class a base expression names, across models/."""

    def __init__(self, files: Dict[str, ModelFile]) -> None:
        self.files = files
        self.by_module = {f.module: f for f in files.values()}
        self.by_name: Dict[str, List[ModelClass]] = {}
        for f in files.values():
            for cls in f.classes.values():
                self.by_name.setdefault(cls.name, []).append(cls)
        # For stderr: bases found by their name alone, or not found.
        self.notes: List[str] = []

    def _in_module(self, module: str, name: str, depth: int = 0) -> Optional[Base]:
        """``name`` as module ``module`` has it: its class, or what it imports."""
        target = self.by_module.get(module)
        if target is None:
            # A name from outside models/ (nn.Module, PreTrainedModel, ...), or
            # a submodule imported from a package (``from ..models import x``).
            return None
        if name in target.classes:
            return Base(name, target.classes[name])
        if name in target.imports and depth < 8:
            source_module, imported = target.imports[name]
            if imported is not None:
                return self._in_module(source_module, imported, depth + 1)
        return None

    def resolve(self, owner: ModelClass, expr: ast.expr) -> Base:
        model_file = self.files[owner.path]
        written = ast.unparse(expr)
        if isinstance(expr, ast.Subscript):  # Generic[T] and the like
            expr = expr.value
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            alias = model_file.imports.get(expr.value.id)
            if alias is not None:
                module = alias[0] if alias[1] is None else f"{alias[0]}.{alias[1]}"
                found = self._in_module(module, expr.attr)
                if found is not None:
                    return found
            return Base(expr.attr)
        if not isinstance(expr, ast.Name):
            return Base(written)
        name = expr.id
        if name in model_file.classes and model_file.classes[name] is not owner:
            return Base(name, model_file.classes[name])
        if name in model_file.imports:
            module, imported = model_file.imports[name]
            if imported is not None:
                found = self._in_module(module, imported)
                if found is not None:
                    return found
                if module.startswith(MODELS_PACKAGE + ".") or module == MODELS_PACKAGE:
                    self.notes.append(
                        f"models/{owner.path}: {owner.name}'s base {written} "
                        f"is imported from {module}, which has no such class"
                    )
                return Base(imported)
        candidates = [c for c in self.by_name.get(name, []) if c is not owner]
        if len(candidates) == 1:
            self.notes.append(
                f"models/{owner.path}: {owner.name}'s base {name} is neither "
                f"defined nor imported there; taken from models/{candidates[0].path}"
            )
            return Base(name, candidates[0])
        if candidates:
            self.notes.append(
                f"models/{owner.path}: {owner.name}'s base {name} is neither "
                "defined nor imported there and several files define it: "
                + ", ".join(sorted(c.path for c in candidates))
            )
        return Base(name)


def _merge(sequences: List[List[Base]]) -> Optional[List[Base]]:
    """C3 merge; None when the bases admit no consistent order."""
    sequences = [list(s) for s in sequences if s]
    order: List[Base] = []
    while sequences:
        for seq in sequences:
            head = seq[0]
            if not any(head in s[1:] for s in sequences):
                break
        else:
            return None
        order.append(head)
        sequences = [[b for b in s if b != head] for s in sequences]
        sequences = [s for s in sequences if s]
    return order


def linearize(cls: ModelClass, memo: Dict[int, List[Base]], stack=()) -> List[Base]:
    """The class's resolved bases in MRO order, own entry first."""
    key = id(cls)
    if key in memo:
        return memo[key]
    own = Base(cls.name, cls)
    if key in stack:  # a cycle by name only (two same-named classes)
        return [own]
    chains = []
    for base in cls.resolved:
        if base.cls is None:
            chains.append([base])
        else:
            chains.append(linearize(base.cls, memo, stack + (key,)))
    merged = _merge(chains + [list(cls.resolved)])
    if merged is None:  # fall back to depth-first, first occurrence kept
        merged = []
        for chain in chains:
            merged += [b for b in chain if b not in merged]
    memo[key] = [own] + merged
    return memo[key]


# ---------------------------------------------------------------------------
# The series' answers
# ---------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# Families the DP encoder could spread but that are deliberately not warmed,
# and why.
NOT_WARMED = {
    "GlmImageForConditionalGeneration": (
        "serving it with --mm-enable-dp-encoder is broken upstream (its vision "
        "MLP is tensor-parallel while the DP encoder gives each rank other "
        "images)"
    ),
}


def warm_up_of(chain: List[Base]) -> Optional[Tuple[ModelClass, WarmUpHook]]:
    """The vision warm-up the class's precompile_kernels_after_loading runs, as
    the MRO finds it: (the class whose hook calls ``warm_up_vision_tower``, that
    hook), or None. A hook without a warm-up call that calls super()'s passes
    on to the next class that defines one."""
    for base in chain:
        hook = base.cls.hook if base.cls else None
        if hook is None:
            continue
        if hook.calls is not None:
            return base.cls, hook
        if not hook.calls_super:
            return None
    return None


def answer_of(chain: List[Base]) -> Optional[str]:
    """``dp_encoder_spreads_images`` as the MRO finds it, as written."""
    for base in chain:
        if base.cls is not None and base.cls.answer is not None:
            return base.cls.answer
    return None


def _constant(name: str, owner: ModelClass, files: Dict[str, ModelFile]):
    """An integer constant of the owner's file, or one it imports from models/."""
    own = files[owner.path]
    if name in own.constants:
        return own.constants[name]
    module, imported = own.imports.get(name, (None, None))
    for other in files.values():
        if other.module == module and imported in other.constants:
            return other.constants[imported]
    raise ValueError(name)


def _evaluate(expr: ast.expr, owner: ModelClass, files: Dict[str, ModelFile]):
    """A literal calls expression (lists, tuples, ints, ``[grid] * N``)."""
    if isinstance(expr, (ast.List, ast.Tuple)):
        return [_evaluate(e, owner, files) for e in expr.elts]
    if isinstance(expr, ast.Constant) and type(expr.value) is int:
        return expr.value
    if isinstance(expr, ast.Name):
        return _constant(expr.id, owner, files)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mult):
        return _evaluate(expr.left, owner, files) * _evaluate(expr.right, owner, files)
    raise ValueError(ast.unparse(expr))


def _format_grid(grid) -> str:
    return "[" + ",".join(str(v) for v in grid) + "]"


def _format_call(grids) -> str:
    """One tower call: ``[[1,32,32]]``, or ``[6x[1,8,8]]`` for a repeat."""
    if len(grids) > 1 and all(g == grids[0] for g in grids):
        return f"[{len(grids)}x{_format_grid(grids[0])}]"
    return "[" + ",".join(_format_grid(g) for g in grids) + "]"


def plan_text(owner: ModelClass, hook: WarmUpHook, files: Dict[str, ModelFile]) -> str:
    try:
        calls = _evaluate(hook.calls, owner, files)
        if not all(isinstance(c, list) for c in calls):
            raise ValueError("not a list of grid lists")
        text = " ".join(_format_call(c) for c in calls)
    except ValueError:
        text = f"`{ast.unparse(hook.calls)}`"
    tower = f"`{hook.tower}`" if hook.tower else "?"
    via = f" via `{hook.call}`" if hook.call else ""
    return f"{tower}: {text}{via}"


def build_rows(models_dir: str) -> Tuple[List[List[str]], List[str]]:
    files = parse_models(models_dir)
    resolver = Resolver(files)
    classes = [c for f in files.values() for c in f.classes.values()]
    for cls in classes:
        cls.resolved = [resolver.resolve(cls, expr) for expr in cls.bases]
    memo: Dict[int, List[Base]] = {}
    rows = []
    for cls in sorted(classes, key=lambda c: (c.path, c.line)):
        chain = linearize(cls, memo)
        # Each method as the MRO finds it: the first class that binds it.
        has = set()
        for name in FEATURES:
            bound = [
                b.cls.defines[name] for b in chain if b.cls and name in b.cls.defines
            ]
            if bound and bound[0]:
                has.add(name)
        if not has:
            continue
        names = [base.name for base in chain]
        answer = answer_of(chain)
        spreads = answer is not None and answer != "False"
        if answer is None:
            vision = "per-request (no answer)"
        elif not spreads:
            vision = "per-request (answers False)"
        else:
            vision = "DP"
        cells = {
            "image": vision if "get_image_feature" in has else NO_METHOD,
            "video": vision if "get_video_feature" in has else NO_METHOD,
            "audio": "per-request" if "get_audio_feature" in has else NO_METHOD,
        }
        has_vision = bool(has & {"get_image_feature", "get_video_feature"})

        found = warm_up_of(chain)
        reason = next((NOT_WARMED[n] for n in names if n in NOT_WARMED), None)
        if reason is not None:
            warm = f"none: {reason}"
        elif has_vision and spreads and found is not None:
            warm = plan_text(*found, files)
        elif has_vision and spreads:
            warm = "none (no plan)"
        else:
            warm = "none (not data-parallel)"

        rows.append(
            [
                f"`{cls.name}`",
                f"`{cls.path}`",
                cells["image"],
                cells["video"],
                cells["audio"],
                f"`{answer}`" if answer is not None else NO_METHOD,
                warm,
            ]
        )
    return rows, resolver.notes


# ---------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------

FOOTNOTES = """\
"DP": the class answers `dp_encoder_spreads_images` (its own or, along its \
bases, the first one defined; "answer" shows what it returns) with something \
other than `False`. Where that answer holds (the model was built \
data-parallel) and `hip_dp_encoder_batches_vit()` holds, ROCm batches the \
step's items across requests. "per-request": ROCm keeps one encoder call per \
request, as upstream (audio always). "—": no such method. CUDA batches every \
class. Warm-up plan: the tower and the calls (patch grids, one list per tower \
call) that the class's `precompile_kernels_after_loading` (own or inherited) \
hands `warm_up_vision_tower`, and the call function where it is not the \
default."""
GROUP_COLUMNS = COLUMNS[2:] + ("classes",)


def _is_dp(row: List[str]) -> bool:
    return "DP" in (row[2], row[3])


def render(rows: List[List[str]], command: str, version: str) -> str:
    """The classes the DP encoder spreads, one row each; the others grouped by
    their cells, one row per group."""
    lines = [
        BEGIN,
        f"Generated by `{command}` from SGLang {version}: {len(rows)} classes.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += [
        "| " + " | ".join(_cell(c) for c in row) + " |" for row in rows if _is_dp(row)
    ]
    groups: Dict[Tuple[str, ...], List[str]] = {}
    for row in rows:
        if not _is_dp(row):
            cells = [_cell(c) for c in row]
            groups.setdefault(tuple(cells[2:]), []).append(f"{cells[0]} ({cells[1]})")
    lines += [
        "",
        "| " + " | ".join(GROUP_COLUMNS) + " |",
        "|" + "---|" * len(GROUP_COLUMNS),
    ]
    lines += [
        "| " + " | ".join(key) + " | " + ", ".join(names) + " |"
        for key, names in groups.items()
    ]
    lines += ["", FOOTNOTES, END]
    return "\n".join(lines) + "\n"


_GROUPED = re.compile(r"^(`[^`]+`) \((`[^`]+`)\)$")


def parse_table(text: str) -> Dict[Tuple[str, str], List[str]]:
    """Every class between the markers, keyed by (class, file): a row of the
    first table, or a name in a row of the grouped one."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"no {BEGIN} ... {END} block")
    rows = {}
    grouped = False
    for line in text[start:end].splitlines():
        line = line.strip()
        if not line.startswith("|") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip("|"))]
        if cells and cells[0] in (COLUMNS[0], GROUP_COLUMNS[0]):
            grouped = cells[0] == GROUP_COLUMNS[0]
            continue
        if not grouped:
            rows[(cells[0], cells[1] if len(cells) > 1 else "")] = cells
            continue
        for entry in cells[-1].split(", ") if len(cells) > 1 else []:
            m = _GROUPED.match(entry.strip())
            name, path = (m.group(1), m.group(2)) if m else (entry.strip(), "")
            rows[(name, path)] = [name, path, *cells[:-1]]
    return rows


def _around_block(text: str) -> Tuple[str, str]:
    """The text of a file before and after its table block."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"an existing file without a {BEGIN} ... {END} block")
    after = text[end + len(END) :]
    return text[:start], after[1:] if after.startswith("\n") else after


def compare(
    generated: List[List[str]], documented: Dict[Tuple[str, str], List[str]]
) -> List[str]:
    """One line per class missing from ``documented``, differing there, or
    listed there but not generated."""

    def named(key: Tuple[str, str]) -> str:
        return f"{key[0].strip('`')} ({key[1].strip('`')})"

    problems = []
    fresh = {}
    for row in generated:
        cells = [_cell(c) for c in row]
        key = (cells[0], cells[1])
        fresh[key] = cells
        if key not in documented:
            problems.append(f"missing: {named(key)}")
        elif documented[key] != cells:
            problems.append(
                f"differs: {named(key)}: now | " + " | ".join(cells[2:]) + " |"
            )
    for key in documented:
        if key not in fresh:
            problems.append(f"not in the tree: {named(key)}")
    return problems


def _version(root: str) -> str:
    """The version of the SGLang tree at ``root`` (its _version.py, as built)."""
    path = os.path.join(root, "_version.py")
    if os.path.exists(path):
        spec = importlib.util.spec_from_file_location("_sglang_tree_version", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if getattr(module, "__version__", None):
            return module.__version__
    import sglang.version

    return sglang.version.__version__


def _default_root() -> Optional[str]:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description="Every SGLang model class with an image, video or audio "
        "encoder: DP encoder per modality, its answer, warm-up plan (a row per "
        "class the DP encoder spreads; the others grouped)."
    )
    parser.add_argument(
        "--sglang-root",
        metavar="DIR",
        help="an sglang package folder whose srt/models/ to walk "
        "(default: the importable sglang's)",
    )
    parser.add_argument(
        "--out",
        metavar="FILE",
        help="write the table block to a new FILE, or in place of the block "
        "between the markers of an existing one ('-': stdout)",
    )
    parser.add_argument(
        "--check",
        metavar="FILE",
        help="compare the table between the markers in FILE; exit 1 on a difference",
    )
    args = parser.parse_args(argv)

    root = args.sglang_root or _default_root()
    if root is None:
        parser.error("sglang is not importable; pass --sglang-root DIR")
    models_dir = os.path.join(root, "srt", "models")
    if not os.path.isdir(models_dir):
        parser.error(f"--sglang-root {root}: no srt/models folder there")
    documented = None
    if args.check:
        try:
            with open(args.check, encoding="utf-8") as f:
                documented = parse_table(f.read())
        except (OSError, ValueError) as error:
            parser.error(f"--check {args.check}: {error}")
    around = ("", "")  # what stays of --out FILE before and after the block
    if args.out and args.out != "-":
        folder = os.path.dirname(os.path.abspath(args.out))
        if not os.path.isdir(folder):
            parser.error(f"--out {args.out}: no folder {folder}")
        if os.path.exists(args.out):
            try:
                with open(args.out, encoding="utf-8") as f:
                    around = _around_block(f.read())
            except (OSError, ValueError) as error:
                parser.error(f"--out {args.out}: {error}")

    rows, notes = build_rows(models_dir)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)

    command = " ".join(
        [".venv/bin/python scripts/dp_encoder_table.py"]
        + [shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])]
    )
    markdown = render(rows, command, _version(root))
    if args.out == "-" or (not args.out and not args.check):
        sys.stdout.write(markdown)
    elif args.out:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(args.out)))
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(around[0] + markdown + around[1])
        os.chmod(tmp, 0o644)
        os.replace(tmp, args.out)
    if documented is None:
        return 0
    problems = compare(rows, documented)
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
