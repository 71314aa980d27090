"""Which model classes' encoders the DP encoder spreads: one table row per class.

Every class under SGLang's ``srt/models/`` (subfolders included) that defines
or inherits ``get_image_feature``, ``get_video_feature`` or
``get_audio_feature`` gets a markdown row: per modality, whether
``--mm-enable-dp-encoder`` spreads its items over the attention-TP ranks
(the series' ``_DP_ENCODERS`` in ``multimodal/vit_batching.py``, looked up
along the class's bases), the unit ``--mm-max-encoder-patches-per-call``
counts, and its vision warm-up (the ``warm_up_vision_encoder`` call of its
``precompile_kernels_after_loading``, grids from ``multimodal/vision_warmup.py``).

The model files are parsed with ``ast``, never imported (many import GPU-only
code); base classes are resolved by name across the files under ``models/``
(through each file's imports; a base found by its name alone, or not found
although models/ has that name, is reported on stderr as a note).
Only the series' tables are imported, on CPU.

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
COLUMNS = ("class", "file", "image", "video", "audio", "cap unit", "warm-up plan")
NO_METHOD = "—"
NOT_DP_CAP = "patches from the grid, else tokens"


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
    resolved: List["Base"] = field(default_factory=list)


@dataclass(frozen=True)
class WarmUpHook:
    """A model class's own ``precompile_kernels_after_loading``, as written:
    the ``warm_up_vision_encoder(self, self.<tower>, <CALLS>, ...)`` call in
    it (tower attribute and the name of the calls constant in
    ``vision_warmup``), and whether it calls ``super()``'s hook."""

    tower: Optional[str]
    calls: Optional[str]
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


def _decorated_warm_up(node: ast.ClassDef) -> Optional[WarmUpHook]:
    """The hook ``@vision_warmup.warms_vision_tower_first("<tower>", <CALLS>,
    ...)`` gives the class: the warm-up, then the class's own hook."""
    for decorator in node.decorator_list:
        if not isinstance(decorator, ast.Call) or len(decorator.args) < 2:
            continue
        fn = decorator.func
        name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
        if name != "warms_vision_tower_first":
            continue
        tower_arg, calls_arg = decorator.args[:2]
        tower = tower_arg.value if isinstance(tower_arg, ast.Constant) else None
        calls = (
            calls_arg.attr
            if isinstance(calls_arg, ast.Attribute)
            else getattr(calls_arg, "id", None)
        )
        return WarmUpHook(tower, calls, False)
    return None


def _warm_up_hook(node: ast.ClassDef) -> Optional[WarmUpHook]:
    """The class body's own warm-up hook (a ``precompile_kernels_after_loading``
    or the class decorator that gives it one), or None when it defines none."""
    decorated = _decorated_warm_up(node)
    if decorated is not None:
        return decorated
    for item in node.body:
        if not (
            isinstance(item, ast.FunctionDef)
            and item.name == "precompile_kernels_after_loading"
        ):
            continue
        tower = calls = None
        calls_super = False
        for call in ast.walk(item):
            if not isinstance(call, ast.Call):
                continue
            fn = call.func
            if isinstance(fn, ast.Name) and fn.id == "warm_up_vision_encoder":
                tower_arg, calls_arg = call.args[1], call.args[2]
                if isinstance(tower_arg, ast.Attribute):
                    tower = tower_arg.attr
                if isinstance(calls_arg, ast.Name):
                    calls = calls_arg.id
            elif (
                isinstance(fn, ast.Attribute)
                and fn.attr == "precompile_kernels_after_loading"
                and isinstance(fn.value, ast.Call)
                and isinstance(fn.value.func, ast.Name)
                and fn.value.func.id == "super"
            ):
                calls_super = True
        return WarmUpHook(tower, calls, calls_super)
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
            files[rel] = ModelFile(rel, module, {}, {})
            for node in _module_level(tree.body):
                if isinstance(node, ast.ClassDef):
                    files[rel].classes[node.name] = ModelClass(
                        node.name,
                        rel,
                        node.lineno,
                        node.bases,
                        _class_defines(node),
                        _warm_up_hook(node),
                    )
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


def _per_token_text(fn) -> str:
    """The expression of a ``per_token`` lambda, read from its source line."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return "set"
    try:
        with open(code.co_filename, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError):
        return "set"
    found = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Lambda) and node.lineno == code.co_firstlineno
    ]
    return f"`{ast.unparse(found[0].body)}`" if len(found) == 1 else "set"


def _unit_text(dp) -> str:
    if dp.per_token is None:
        return dp.unit
    return f"{dp.unit}, per token: {_per_token_text(dp.per_token)}"


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


def warm_up_of(chain: List[Base]) -> Optional[Tuple[str, str]]:
    """The vision warm-up the class's precompile_kernels_after_loading runs, as
    the MRO finds it: (tower attribute, name of the calls in vision_warmup),
    or None. A hook without a warm-up call that calls super()'s passes on to
    the next class that defines one."""
    for base in chain:
        hook = base.cls.hook if base.cls else None
        if hook is None:
            continue
        if hook.calls is not None:
            return hook.tower, hook.calls
        if not hook.calls_super:
            return None
    return None


def build_rows(models_dir: str) -> Tuple[List[List[str]], List[str]]:
    from sglang.srt.multimodal import vision_warmup, vit_batching
    from sglang.srt.multimodal.modality import Modality

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
        family = next(
            (
                vit_batching._DP_ENCODERS[n]
                for n in names
                if n in vit_batching._DP_ENCODERS
            ),
            None,
        )
        cells, dp_units, plain = {}, [], []
        for method, modality in (
            ("get_image_feature", Modality.IMAGE),
            ("get_video_feature", Modality.VIDEO),
        ):
            label = modality.name.lower()
            if method not in has:
                cells[label] = NO_METHOD
            elif family is None:
                cells[label] = "no (not listed)"
                plain.append(label)
            elif modality not in family:
                cells[label] = "no (listed)"
                plain.append(label)
            else:
                dp = family[modality]
                cells[label] = f"DP ({dp.runner})"
                dp_units.append((label, _unit_text(dp)))
        cells["audio"] = "per-request" if "get_audio_feature" in has else NO_METHOD

        if not dp_units:
            cap = NOT_DP_CAP
        elif not plain and len({u for _, u in dp_units}) == 1:
            cap = dp_units[0][1]
        else:
            cap = "; ".join(
                [f"{label}: {unit}" for label, unit in dp_units]
                + [f"{label}: {NOT_DP_CAP}" for label in plain]
            )

        plan = warm_up_of(chain)
        by_class = next(
            (n for n in names if n in vision_warmup._WARM_UPS_BY_CLASS), None
        )
        reason = next((NOT_WARMED[n] for n in names if n in NOT_WARMED), None)
        if dp_units and by_class is not None:
            warm = f"`_WARM_UPS_BY_CLASS[{by_class!r}]`"
        elif dp_units and plan is not None:
            tower, calls_name = plan
            calls = getattr(vision_warmup, calls_name)
            if callable(calls):  # grids that depend on the tower and the TP width
                warm = f"`{tower}`: `{calls_name}(tower)`"
            else:
                calls = " ".join(vision_warmup._format_call(c) for c in calls)
                warm = f"`{tower}`: {calls}"
        elif reason is not None:
            warm = f"none: {reason}"
        elif dp_units:
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
                cap,
                warm,
            ]
        )
    return rows, resolver.notes


# ---------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------

FOOTNOTES = """\
"DP (runner)": with `--mm-enable-dp-encoder` at attention-TP above 1, and \
when the model was built data-parallel (`use_data_parallel`), one encoder \
call's items of that modality are spread over the attention-TP ranks by that \
runner (`DpEncoder` in `multimodal/vit_batching.py`), and ROCm batches them \
across requests. "no (listed)": the class's family is in `_DP_ENCODERS` \
without this modality; "no (not listed)": no class on its base chain is; ROCm \
keeps both per-request, as upstream. "—": the class has no such method.

Audio: on ROCm the gate keeps audio per-request for every model, so every \
class with `get_audio_feature` reads "per-request".

Cap unit: what `--mm-max-encoder-patches-per-call` counts per item. Where a \
per-token factor is given, an item counts its placeholder tokens times that \
factor; otherwise the patches of its grid (t·h·w), else its tokens.

Warm-up plan: the tower and the calls (patch grids) that the class's \
`precompile_kernels_after_loading` (its own or, along its bases, the first \
one defined) hands `warm_up_vision_encoder`, for classes the DP encoder \
spreads; otherwise why not, or none."""


def render(rows: List[List[str]], command: str, version: str) -> str:
    lines = [
        BEGIN,
        f"Generated by `{command}` from SGLang {version}: {len(rows)} classes.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    lines += ["", FOOTNOTES, END]
    return "\n".join(lines) + "\n"


def parse_table(text: str) -> Dict[Tuple[str, str], List[str]]:
    """The rows between the markers, keyed by (class, file)."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"no {BEGIN} ... {END} block")
    rows = {}
    for line in text[start:end].splitlines():
        line = line.strip()
        if not line.startswith("|") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip("|"))]
        if cells and cells[0] == COLUMNS[0]:
            continue
        rows[(cells[0], cells[1] if len(cells) > 1 else "")] = cells
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
        description="One markdown row per SGLang model class with an image, "
        "video or audio encoder: DP encoder per modality, cap unit, warm-up plan."
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

    from cpu_support.standins.prepare import prepare_cpu_process

    prepare_cpu_process()
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
