"""The documentation site (mkdocs.yml, docs/) builds strictly, and shows all it must.

``mkdocs build --strict`` fails on a broken link between pages, a missing page or a warning
of a plugin (a docstring mkdocstrings cannot render, a CLI command mkdocs-click cannot load);
``scripts/test.sh`` runs it too. The examples on the pages are run by tests/test_readme.py.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

#: Where users import error types from; every public exception class there is documented.
ERROR_MODULES = ("eventlog", "streaming", "spark_adapter.errors", "lockstore", "lockstore.registry")
OURS = ("eventlog", "streaming", "spark_adapter", "lockstore")


class _Loader(yaml.SafeLoader):
    """mkdocs.yml's YAML, its ``!!python/name:`` tags read as plain strings."""


_Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: suffix)


def _config() -> dict[str, Any]:
    config: dict[str, Any] = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)
    return config


def _nav_pages(nav: Any) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in _nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    raise AssertionError(f"unexpected nav entry {nav!r}")


def test_every_page_is_in_the_nav() -> None:
    in_nav = _nav_pages(_config()["nav"])
    on_disk = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(set(in_nav)) == on_disk, "docs/ pages and mkdocs.yml's nav differ"
    assert len(in_nav) == len(set(in_nav)), "a page is in the nav twice"


def test_readme_links_into_the_site() -> None:
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [t for t in targets if "://" not in t]
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"
    guides = {t for t in local if t.startswith("docs/guides/")}
    assert len(guides) >= 5, f"the README links to {len(guides)} guides"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": str(Path(sys.executable).parent), "HOME": str(out)},
    )
    assert build.returncode == 0, f"mkdocs build --strict failed:\n{build.stdout}\n{build.stderr}"
    return out


@pytest.mark.timeout(300)
def test_site_builds_strictly(site: Path) -> None:
    built = sorted(p.relative_to(site).as_posix() for p in site.rglob("index.html"))
    pages = sorted(
        (p.relative_to(DOCS).with_suffix("").as_posix() + "/index.html").removeprefix("index/")
        for p in DOCS.rglob("*.md")
    )
    wanted = [page.replace("/index/index.html", "/index.html") for page in pages]
    assert set(wanted) <= set(built), f"pages not built: {sorted(set(wanted) - set(built))}"


def _error_types() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for name in ERROR_MODULES:
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", [n for n in vars(module) if not n.startswith("_")]):
            value = getattr(module, attr)
            if (
                isinstance(value, type)
                and issubclass(value, BaseException)
                and value.__module__.split(".")[0]
                in (
                    "eventlog",
                    "streaming",
                    "spark_adapter",
                    "lockstore",
                )
            ):
                found[attr] = value
    return found


@pytest.mark.timeout(300)
def test_every_error_type_is_documented(site: Path) -> None:
    page = (site / "reference" / "errors" / "index.html").read_text()
    documented = set(re.findall(r'id="[\w.]+\.(\w+)"', page))
    types = _error_types()
    assert len(types) > 40
    missing = sorted(set(types) - documented)
    assert not missing, f"error types missing from docs/reference/errors.md: {missing}"


@pytest.mark.timeout(300)
def test_every_cli_command_is_documented(site: Path) -> None:
    from eventlog.cli.click_command import command

    page = (site / "reference" / "cli" / "index.html").read_text()
    names = [f"eventlog {name}" for name in command.commands]  # type: ignore[attr-defined]
    names += [f"eventlog slots {name}" for name in command.commands["slots"].commands]  # type: ignore[attr-defined]
    missing = [name for name in names if name not in page]
    assert not missing, f"CLI commands missing from docs/reference/cli.md: {missing}"


def test_every_table_property_is_documented() -> None:
    """Every table property the engine interprets (validates) has a row in the reference."""
    from eventlog.files import column_mapping, row_tracking
    from eventlog.log import cleanup, in_commit_timestamps
    from eventlog.log.checkpoint_v2 import CHECKPOINT_POLICY_KEY
    from eventlog.ops import alter
    from eventlog.snapshot.isolation import ISOLATION_LEVEL_KEY

    interpreted = {
        *alter._BOOL_PROPERTIES,
        *alter._INT_PROPERTIES,
        *alter._INTERVAL_PROPERTIES,
        alter.AUTO_COMPACT_KEY,
        CHECKPOINT_POLICY_KEY,
        cleanup.PROTECTION_KEY,
        column_mapping.MODE_KEY,
        ISOLATION_LEVEL_KEY,
        in_commit_timestamps.ENABLE_KEY,
        row_tracking.SUSPENDED_KEY,
    }
    page = (DOCS / "reference" / "options.md").read_text()
    rows = set(re.findall(r"^\| `([\w.]+)`", page, flags=re.MULTILINE))
    rows |= set(re.findall(r"^\| `[\w.]+`, `([\w.]+)`", page, flags=re.MULTILINE))
    missing = sorted(interpreted - rows)
    assert len(interpreted) >= 15
    assert not missing, f"table properties missing from docs/reference/options.md: {missing}"
