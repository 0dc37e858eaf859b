"""The README cannot drift from the CLI: every `rcswarm ...` command in its shell blocks parses with
the real parsers (configs it names are loaded and validated), every `make` target exists, and the
two set-up commands open it. Commands that need a running coordinator are parsed, not run."""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from rcswarm.cli import bench, bench_gpu, data, dht, fit, launch, main, run, status, worker
from rcswarm.cli import coordinator as coordinator_cli
from rcswarm.config.runspec import RunSpec

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SHELL_KEYWORDS = {"do", "then", "else", "time", "nohup", "exec"}


def shell_blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", text, flags=re.DOTALL)


def commands(block: str) -> Iterator[list[str]]:
    """Each simple command of a shell block as words: continuations joined, comments dropped, lines split at
    `;`, `&`, `&&` and `|`, leading keywords (`do`, `time`, ...) removed; `$VAR` and `$i` stay literal."""
    for line in block.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split, lexer.commenters = True, "#"
        current: list[str] = []
        for token in [*lexer, ";"]:
            if set(token) <= set(";&|"):
                while current and current[0] in SHELL_KEYWORDS:
                    current.pop(0)
                if current:
                    yield current
                current = []
            else:
                current.append(token)


def readme_commands(program: str) -> list[list[str]]:
    return [words for block in shell_blocks(README.read_text()) for words in commands(block) if words[0] == program]


def _examples_config(path: str) -> Path | None:
    """A config the README names that ships in the repository (examples/...), else None."""
    return ROOT / path if path.startswith("examples/") else None


def parse(words: list[str]) -> argparse.Namespace | int:
    """Parse an `rcswarm ...` command line with the command's real parser; raise on a usage error."""
    command, argv = words[1], words[2:]
    if command in ("--version", "-V", "--help"):
        return main.main([command])
    parsers = {"fit": fit.parser, "status": status.parser, "dht": dht.parser}
    if command in parsers:
        return parsers[command]().parse_args(argv)
    if command == "run":
        args = run.parse_args(argv)
        assert not isinstance(args, int), words
        if args.config is not None:
            assert _examples_config(str(args.config)) is not None, f"{words}: name a config under examples/"
            args.config = ROOT / args.config
        run.load_spec(args)  # the config loads and validates, with the overrides applied
        return args
    if command == "launch":
        assert argv[0] == "ray", words
        return launch.parser().parse_args(argv[1:])
    if command == "data":
        assert argv[0] == "frames", words
        return data.parser().parse_args(argv[1:])
    if command == "bench":
        assert argv[0] in ("diag", "gpu"), words
        if argv[0] == "gpu":
            return bench_gpu.parser().parse_args(argv[1:])
        args = bench.parse_args(argv[1:])
        assert not isinstance(args, int), words
        return args
    if command == "coordinator":
        args = coordinator_cli.parse_args(argv)
        config = _examples_config(args.config)
        assert config is not None, f"{words}: name a config under examples/"
        RunSpec.from_toml(config)
        return args
    if command == "worker":
        return worker.parse_args(argv)
    raise AssertionError(f"the README runs an unknown command: {' '.join(words)}")


def test_the_two_setup_commands_open_the_readme():
    first = shell_blocks(README.read_text())[0]
    assert [words for words in commands(first)] == [["make", "demo"], ["make", "test"]]


def test_the_readme_shows_every_command_and_the_manual_flow():
    shown = {words[1] for words in readme_commands("rcswarm")}
    assert {"run", "status", "fit", "data", "bench", "coordinator", "worker", "launch", "dht"} <= shown
    workers = [words for words in readme_commands("rcswarm") if words[1] == "worker"]
    assert workers and any("--threads" in words for words in workers), "the manual flow shows --threads"
    coordinators = [words for words in readme_commands("rcswarm") if words[1] == "coordinator"]
    assert coordinators and any("--http-port" in words for words in coordinators)


@pytest.mark.parametrize("words", readme_commands("rcswarm"), ids=lambda words: " ".join(words[1:4]))
def test_every_rcswarm_command_in_the_readme_parses(words: list[str], capsys: pytest.CaptureFixture[str]):
    try:
        result = parse(words)
    except SystemExit:
        raise AssertionError(f"{' '.join(words)}: usage error {capsys.readouterr().err.strip()}") from None
    assert result == 0 or isinstance(result, argparse.Namespace), words


def test_every_make_target_in_the_readme_exists():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.MULTILINE))
    used = [words[1] for words in readme_commands("make")]
    assert used and set(used) <= targets, set(used) - targets


def test_every_file_the_readme_names_exists():
    named = set(re.findall(r"\b((?:examples|docs|cli|tests)/[\w./-]+\.(?:toml|md|py|png))", README.read_text()))
    assert named and not [path for path in named if not (ROOT / path).exists()]


def test_a_drifted_command_is_caught():
    with pytest.raises(SystemExit):
        parse(["rcswarm", "worker", "--coordinator", "127.0.0.1:50051", "--thread-count", "1"])
    with pytest.raises(ValueError, match="does not exist"):
        parse(["rcswarm", "run", "examples/no_such.toml"])


def _sections(text: str) -> dict[str, str]:
    """The README's `## ` sections by heading."""
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def _activates_first(block: str) -> bool:
    """Whether a shell block activates the venv `make` installs before its first `rcswarm` command (issue #33: the
    by-hand commands work as written, not only in a shell that has `rcswarm` on its PATH)."""
    venv = re.search(r"^VENV \?= (\S+)$", (ROOT / "Makefile").read_text(), flags=re.MULTILINE).group(1)
    for words in commands(block):
        if words[:2] in ([".", f"{venv}/bin/activate"], ["source", f"{venv}/bin/activate"]):
            return True
        if words[0] == "rcswarm":
            return False
    return True


def test_the_by_hand_commands_run_in_the_venv():
    sections = _sections(README.read_text())
    by_hand = [block for block in shell_blocks(sections[next(s for s in sections if s.startswith("By hand"))])]
    one_machine_ray = [block for block in shell_blocks(README.read_text()) if "ray start" in block]
    assert len(by_hand) == 2 and len(one_machine_ray) == 1
    assert all(_activates_first(block) for block in by_hand + one_machine_ray)
    assert not _activates_first("rcswarm status --coordinator 127.0.0.1:50051\n. .venv/bin/activate\n")


def test_the_one_machine_ray_recipe_launches_cpu_workers():
    (block,) = [block for block in shell_blocks(README.read_text()) if "ray start" in block]
    launches = [words for words in commands(block)
                if words[:3] == ["rcswarm", "launch", "ray"] and "--workers" in words]
    (args,) = [launch.parser().parse_args(words[3:]) for words in launches]
    assert launch.check_arguments(args) is None
    plan = launch.plan_of(args, args.coordinator)
    assert (plan.gpus_per_worker, plan.worker.device) == (0.0, "cpu")


def test_the_docs_give_commands_without_machine_paths():
    """No author's checkout or temporary directory in a command of the README or docs/ (a placeholder or a
    variable instead)."""
    found = []
    for path in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        code = re.findall(r"```(?:sh|bash|text)?\n(.*?)```", text, flags=re.DOTALL)
        code += re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.DOTALL))
        found += [f"{path.name}: {line.strip()}" for block in code for line in block.splitlines()
                  if re.search(r"(?<![\w$}])/(?:work|tmp|home|root)/", line)]
    assert not found, "\n".join(found)
