"""The docs site builds without a warning and gives every public name an entry.

The build runs in a subprocess, as ``tox -e docs`` runs it (``-W --keep-going``), so a
warning anywhere (a docstring numpydoc cannot parse, a broken link between pages, a page in
no toctree) fails the test with Sphinx's message.
"""
from __future__ import annotations

import importlib
import inspect
import re
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import streamz

import streamlb
from streamlb import planner
from streamz import Stream

DOCS = Path(__file__).resolve().parent.parent / "docs"

# Modules with a page of the API reference: each public name (its ``__all__``) has an entry
# under the module, or under ``streamlb`` when the top level re-exports it.
MODULES = [
    "streamlb.balancer",
    "streamlb.datasets",
    "streamlb.nexmark",
    "streamlb.simulator",
    "streamlb.scaler",
    "streamlb.keygroups",
    "streamlb.routing",
    "streamlb.plugin",
    "streamlb.exceptions",
    "streamlb.latency",
]

# Classes whose public methods and properties each have an entry.
CLASSES = ["streamlb.Job", "streamlb.RoutingTable", "streamlb.LoadReport", "streamlb.Balancer",
           "streamlb.scaler.Scaler", "streamlb.simulator.Trace"]


def _inventory(path: Path) -> dict[str, str]:
    """Object name -> ``domain:role`` from an ``objects.inv`` (format version 2)."""
    raw = path.read_bytes()
    header = b"".join(raw.splitlines(keepends=True)[:4])
    assert header.startswith(b"# Sphinx inventory version 2"), header
    body = zlib.decompress(raw[len(header):]).decode()
    out = {}
    for line in body.splitlines():
        m = re.match(r"(.+?)\s+(\S+?:\S+)\s+(-?\d+)\s+(\S*)\s+(.*)", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


@pytest.fixture(scope="module")
def inventory(tmp_path_factory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("html")
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(out)],
        capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, f"the docs build failed or warned:\n{proc.stderr}"
    return _inventory(out / "objects.inv")


def _resolve(dotted: str):
    mod, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(mod), name)


def test_top_level_names(inventory):
    missing = [f"streamlb.{n}" for n in streamlb.__all__ if f"streamlb.{n}" not in inventory]
    assert not missing, f"no entry in the API reference for {missing}"


@pytest.mark.parametrize("module", MODULES)
def test_module_names(inventory, module):
    mod = importlib.import_module(module)
    missing, own = [], 0
    for name in mod.__all__:
        top = name in streamlb.__all__ and getattr(streamlb, name) is getattr(mod, name)
        own += not top
        if f"{module}.{name}" not in inventory and not (top and f"streamlb.{name}" in inventory):
            missing.append(f"{module}.{name}")
    assert not missing, f"no entry in the API reference for {missing}"
    if own:     # names of its own, not only re-exports: the module has a page
        assert inventory.get(module) == "py:module", f"{module} has no page in the API reference"


def test_stream_nodes(inventory):
    from streamlb import nodes

    assert inventory.get("streamlb.nodes") == "py:module"
    missing = [f"streamz.Stream.{n}" for n in nodes.__all__ if f"streamz.Stream.{n}" not in inventory]
    assert not missing, f"no entry in the API reference for {missing}"
    assert all(hasattr(streamz.Stream, n) for n in nodes.__all__)


@pytest.mark.parametrize("cls", CLASSES)
def test_class_members(inventory, cls):
    klass = _resolve(cls)
    kinds = (property, classmethod, staticmethod)
    public = [n for n, v in vars(klass).items()
              if not n.startswith("_") and (inspect.isfunction(v) or isinstance(v, kinds))]
    assert public
    missing = [f"{cls}.{n}" for n in public if f"{cls}.{n}" not in inventory]
    assert not missing, f"no entry in the API reference for {missing}"


# -- what the pages say against what the code does (issue 46, item 16) --------------------------------
# These read the pages of the streamlb under test (its checkout) and its CLI's help, build
# nothing, and run in a second or two.

ROOT = Path(streamlb.__file__).resolve().parent.parent


def _pages() -> dict[str, str]:
    """README.md and every page under docs/ but the benchmark log, whose entries are dated:
    what one says was not there yet was true on its day."""
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return {str(p.relative_to(ROOT)): p.read_text() for p in paths if p.name != "benchmark-log.md"}


def _sentences(text: str) -> list[str]:
    """The sentences and table cells of a Markdown page, each on one line."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)         # code says nothing missing
    out = []
    for block in re.split(r"\n\s*\n|\n(?=\s*[-|*] )|\|", text):
        out += re.split(r"(?<=[.;:!?])\s+(?=[A-Z`(])", " ".join(block.split()))
    return [s for s in out if s]


def _plans_a_union() -> bool:
    from streamlb.planner import plan

    a, b = Stream.from_iterable([{"k": 1}]), Stream.from_iterable([{"k": 2}])
    out = a.union(b).sink_to_list()
    p = plan(a, workers=1, key_groups=8, batch_size=10)
    return len(p.stages) == 2 and all(sink is out for sink in p.list_sinks.values())


def _plugin_only_with_a_balancer() -> bool:
    """``run``'s default is no balancer, and the control of such a job (in the driver) never
    adds the plugin; only the plugin's control does."""
    from streamlb._migration import _driver

    return (inspect.signature(streamlb.run).parameters["balancer"].default is None
            and "ensure_plugin" not in inspect.getsource(_driver.DriverControl)
            and "ensure_plugin" in inspect.getsource(_driver.PluginControl))


# Words that say a feature is missing, refused or to come.
MISSING = (r"not yet\b|still to come|\bto come\b|(is|are) (the )?next step|do(es)? not exist yet|(is|are) not "
           r"(yet )?(supported|there|built|available)|not implemented|come with (it|them)|will come")

# feature -> (what proves the code has it, what names it in a sentence, what else denies it there).
# A sentence that names a feature and denies it fails test_no_page_says_a_feature_is_missing.
FEATURES = {
    "writing to Kafka": (lambda: hasattr(Stream, "to_kafka_topic") and "to_kafka_topic" in planner.SUPPORTED,
                         r"writ\w* (to )?Kafka|to_kafka_topic|Kafka sinks?", ""),
    "reading Kafka": (lambda: "from_kafka_topic" in planner.SUPPORTED, r"from_kafka_topic|read\w* (from )?Kafka", ""),
    "union": (_plans_a_union, r"\bunions?\b", r"\brefused\b|\brefuses\b"),
    "joins": (lambda: "join" in planner.SUPPORTED and hasattr(Stream, "join"), r"\b[Jj]oins\b|`join`", ""),
    "checkpoints and recovery": (lambda: callable(streamlb.Job.savepoint) and "checkpoint" in inspect.signature(
        streamlb.run).parameters, r"\b[Cc]heckpoints?\b|\b[Rr]ecover(y|ies)\b|\b[Ss]avepoints?\b", ""),
    "rescaling live": (lambda: callable(streamlb.Job.rescale), r"\b[Rr]escal\w*",
                       r"needs? a restart|stop and (re)?start"),
    "event-time windows": (lambda: hasattr(Stream, "window") and hasattr(Stream, "with_watermark"),
                           r"`window|`with_watermark`|event-time windows", ""),
    "results in the driver while the job runs": (lambda: callable(streamlb.Job.results), r"job\.results|results\(",
                                                 ""),
    "the plugin only for a job with a balancer": (
        _plugin_only_with_a_balancer, r"\bplugin\b",
        r"every job (goes through it|registers (it|the (balancer )?plugin))|without a balancer it runs"),
}


@pytest.mark.parametrize("feature", list(FEATURES))
def test_no_page_says_a_feature_is_missing(feature):
    proof, names, denial = FEATURES[feature]
    assert proof(), f"{feature}: the code no longer has it; take it out of FEATURES"
    deny = re.compile(MISSING + (f"|{denial}" if denial else ""))
    wrong = [f"{page}: {s}" for page, text in _pages().items() for s in _sentences(text)
             if re.search(names, s) and deny.search(s)]
    assert not wrong, f"pages say that {feature} is missing, refused or to come:\n" + "\n".join(wrong)


def test_no_page_points_outside_the_project():
    """The docs stand on their own: every relative link and ``../`` path of README.md and the
    pages leads to a file of the project."""
    wrong = []
    for page, text in _pages().items():
        here = (ROOT / page).parent
        targets = re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", text) + re.findall(r"`(\.\./[^`\s]+)`", text)
        for t in targets:
            if re.match(r"\w+:", t):        # http:, mailto:
                continue
            path = (here / t).resolve()
            if not path.is_relative_to(ROOT) or not path.exists():
                wrong.append(f"{page}: {t}")
    assert not wrong, "pages point at files that are not in the project:\n" + "\n".join(wrong)


def _user_guide_section(start: str, end: str) -> str:
    text = (ROOT / "docs" / "user-guide.md").read_text()
    return text[text.index(start):text.index(end, text.index(start))]


# What Job.__init__ sets on self that users do not read: the deployment its parts share.
JOB_INTERNALS = {"plan", "client", "cluster", "workers", "options", "key_groups", "window", "credits", "balancer",
                 "migration", "actors", "workers_of", "runs", "autoscaler", "topology_lock", "first_tables",
                 "tables", "exchanges", "control", "reconfig", "checkpointer", "recovery", "started_at"}


def _job_attributes() -> set[str]:
    """The public names ``Job.__init__`` assigns on ``self``."""
    import ast
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(streamlb.Job.__init__)))
    out = set()
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        for t in targets:
            for e in (t.elts if isinstance(t, ast.Tuple) else [t]):
                if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
                    out.add(e.attr)
    return {a for a in out if not a.startswith("_")}


def test_the_user_guide_lists_every_job_member():
    rows = _user_guide_section("| method | returns |", "\n\n")
    listed = {m for row in rows.splitlines()[2:] for m in re.findall(r"`(\w+)", row.split("|")[1])}
    members = {n for n, v in vars(streamlb.Job).items() if not n.startswith("_")
               and (inspect.isfunction(v) or isinstance(v, property))}
    attributes = _job_attributes() - JOB_INTERNALS
    assert {"id", "status", "error"} <= attributes
    missing = sorted((members | attributes) - listed)
    assert not missing, f"docs/user-guide.md, the Job table, lists no row for {missing}"
    stale = sorted(listed - members - attributes)
    assert not stale, f"docs/user-guide.md, the Job table, lists {stale}, which Job does not have"


@pytest.mark.parametrize("method, columns", [("metrics()", "METRIC_COLUMNS"),
                                             ("imbalance(operator)", "IMBALANCE_COLUMNS")])
def test_the_user_guide_lists_every_column(method, columns):
    row = next(r for r in _user_guide_section("| method | returns |", "\n\n").splitlines()
               if r.startswith(f"| `{method}` |"))
    listed = {c.strip() for cell in re.findall(r"`([\w, ]+)`", row) if "," in cell for c in cell.split(",")}
    missing = [c for c in getattr(streamlb, columns) if c not in listed]
    assert not missing, f"docs/user-guide.md: the row of {method} does not list its columns {missing}"


def test_the_user_guide_lists_every_run_argument():
    section = _user_guide_section("## Running: `streamlb.run` and `Job`", "`Job` methods:")
    params = [p for p in inspect.signature(streamlb.run).parameters if p != "node"]
    signature = re.search(r"`streamlb\.run\((.*?)\)`", section, re.S).group(1)
    named = re.findall(r"(\w+)=", signature)
    assert named == params, f"the signature in docs/user-guide.md names {named}; run() takes {params}"
    described = set(re.findall(r"`(\w+)(?:=[^`]*)?`", section.split(")`", 1)[1]))
    missing = [p for p in params if p not in described]
    assert not missing, f"docs/user-guide.md: the list under run()'s signature names no {missing}"


COMMANDS = [(), ("prepare",), ("demo",), ("simulate",), ("nexmark",)]


def _bare_options(text: str) -> list[str]:
    """The options and arguments a ``--help`` text shows without a line of help."""
    lines = text.splitlines() + [""]
    out = []
    for line, after in zip(lines, lines[1:]):
        m = re.match(r"^  (-\S.*?|\w[\w-]*)(\s{2,}\S.*)?$", line)
        if m and not m.group(2) and not re.match(r"^\s{20,}\S", after):
            out.append(m.group(1))
    return out


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(("streamlb", *a)))
def test_cli_help_is_plain_text_and_complete(argv, capsys, monkeypatch):
    from streamlb import cli

    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as done:
        cli.main([*argv, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    command = " ".join(("streamlb", *argv))
    markup = re.findall(r"``|:\w+:`|\.\. \w+::|`[^`\n]+`_", text)
    assert not markup, f"{command} --help shows RST markup {markup}:\n{text}"
    internal = re.findall(r"\b_\w+|streamlb\._\w*", text)
    assert not internal, f"{command} --help names internal modules {internal}:\n{text}"
    bare = _bare_options(text)
    assert not bare, f"{command} --help shows no help for {bare}:\n{text}"
    description = text.split("\n\n")[1]
    assert not description.startswith(("options:", "positional arguments:")), f"{command} --help has no description"
