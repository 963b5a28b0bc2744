"""sbatch's reading of a script, exactly (issue 25): getopt_long's prefixes and refusals in
`#SBATCH` lines, `#GPUQ` lines and `gpuq submit`; the pairs sbatch refuses; `-W`; --time in
whole minutes; GPU types alone; job names as SLURM takes them; every file-name pattern; and
the README's table of `#SBATCH` support, made from the code's."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from gpuq.coordinator.front.job_messages import hide_names
from gpuq.directives import asks_to_wait
from gpuq.domain.file_patterns import Fields, expand
from gpuq.domain.limits import check_name, name_in_text
from gpuq.domain.model import JobSpec, output_paths
from gpuq.domain.units import parse_time_limit
from gpuq.errors import InvalidInput
from gpuq.options import SUBMIT_LONG_FLAGS, resolve_submit_args
from gpuq.sbatch_table import LONG, SHORT, USED, support_table
from gpuq.submission import build_spec

README = Path(__file__).parents[2] / "README.md"


def script(tmp_path: Path, *lines: str) -> str:
    path = tmp_path / "job.sh"
    path.write_text("#!/bin/bash\n" + "".join(f"{line}\n" for line in lines) + "true\n")
    return str(path)


def spec(tmp_path: Path, *lines: str, **options: Any) -> JobSpec:
    options.setdefault("environ", {})
    return build_spec(script(tmp_path, *lines), **options)


def refusal(tmp_path: Path, *lines: str, **options: Any) -> str:
    with pytest.raises(InvalidInput) as info:
        spec(tmp_path, *lines, **options)
    text = str(info.value)
    assert "\n" not in text and len(text) < 400, text
    return text


# ---- long options by any unambiguous prefix (getopt_long) ----------------------------------


def test_sbatch_takes_an_unambiguous_prefix_of_a_long_option(tmp_path: Path) -> None:
    built = spec(tmp_path, "#SBATCH --err=e.txt --out o.txt --job=x --time=5 --gpus-per-n=2")
    assert (built.error, built.output, built.name) == ("e.txt", "o.txt", "x")
    assert (built.resources.time_limit, built.resources.gpus) == (300, 2)


def test_an_ambiguous_prefix_is_refused_naming_the_candidates(tmp_path: Path) -> None:
    assert "--ti is ambiguous: --time, --time-min" in refusal(tmp_path, "#SBATCH --ti 5")
    text = refusal(tmp_path, "#SBATCH --cpus=4")  # sbatch has no --cpus
    assert "--cpus is ambiguous: --cpus-per-gpu, --cpus-per-task" in text
    assert "(line 2)" in text


def test_an_exact_match_wins_over_longer_options(tmp_path: Path) -> None:
    notes: list[str] = []
    built = spec(tmp_path, "#SBATCH --mem=4G --gpus=1 --time=10 --wait", warnings=notes)
    assert (built.resources.mem, built.resources.gpus) == (4 << 30, 1)  # not --mem-bind...
    assert built.resources.time_limit == 600  # not --time-min
    assert notes == []


def test_two_names_of_one_option_are_not_ambiguous_and_mean_it(tmp_path: Path) -> None:
    # sbatch's --tasks-per-node is its --ntasks-per-node (it was once warned as unused)
    notes: list[str] = []
    built = spec(tmp_path, "#SBATCH --tasks-per-node=2 --gpus-per-node=2", warnings=notes)
    assert (built.resources.tasks_per_node, notes) == (2, [])
    assert spec(tmp_path, "#SBATCH --tasks-per=4").resources.tasks_per_node == 4  # a prefix
    assert "--tasks-per-node (#SBATCH line 2)" in refusal(tmp_path, "#SBATCH --tasks-per-node=x")


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("#SBATCH --workdir=/tmp", "sbatch has no option --workdir: sbatch renamed it --chdir"),
        ("#SBATCH --name=x", "sbatch has no option --name"),
        ("#SBATCH --frobnicate", "sbatch has no option --frobnicate"),
        ("#SBATCH -Z 2", "sbatch has no option -Z"),
        ("#SBATCH --hold=yes", "--hold takes no value"),
        ("#SBATCH --qos", "needs a value"),
    ],
)
def test_what_sbatch_refuses_is_refused(tmp_path: Path, line: str, why: str) -> None:
    text = refusal(tmp_path, line)
    assert why in text and "#SBATCH (line 2)" in text


def test_options_sbatch_takes_but_gpuq_does_not_use_stay_warnings(tmp_path: Path) -> None:
    notes: list[str] = []
    spec(tmp_path, "#SBATCH --accou=lab -A lab --time-min=5 --input=in.txt", warnings=notes)
    assert notes == [
        "#SBATCH --accou=lab (line 2) is not used by gpuq",
        "#SBATCH -A lab (line 2) is not used by gpuq",
        "#SBATCH --time-min=5 (line 2) is not used by gpuq",
        "#SBATCH --input=in.txt (line 2) is not used by gpuq",
    ]


def test_short_options_group_as_getopt_groups_them(tmp_path: Path) -> None:
    built = spec(tmp_path, "#SBATCH -Ht5 -Jjob")
    assert (built.hold, built.resources.time_limit, built.name) == (True, 300, "job")
    assert "needs a value" in refusal(tmp_path, "#SBATCH -J")


def test_gpuq_lines_and_the_command_line_take_prefixes_of_gpuq_options(tmp_path: Path) -> None:
    built = spec(tmp_path, "#GPUQ --part debug --err e.txt --no-req")
    assert (built.error, built.placement.partitions, built.requeue) == ("e.txt", ("debug",), False)
    text = refusal(tmp_path, "#GPUQ --gpu 2")
    assert "--gpu is ambiguous: --gpu-mem, --gpu-share, --gpus," in text
    words, spelled = resolve_submit_args(["--part", "p", "-G", "2", "--ti=5", "x.sh", "--part"])
    assert words == ["--partition", "p", "-G", "2", "--time=5", "x.sh", "--part"]
    assert spelled == {"partition": "--partition", "gpus": "-G", "time": "--time"}
    # an exact match wins (--cpus, not --cpus-per-task); a value is never read as an option
    assert resolve_submit_args(["--cpus", "2", "--wrap", "--cpus"])[0] == [
        "--cpus",
        "2",
        "--wrap",
        "--cpus",
    ]
    with pytest.raises(ValueError, match="--me is ambiguous: --mem, "):
        resolve_submit_args(["--me", "4G"])
    assert {"--wrap", "--wait", "--parsable", "--error"} <= SUBMIT_LONG_FLAGS


# ---- what sbatch refuses together, -W, errors naming what was written ----------------------


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("--gres=gpu:2", "--gpus-per-node=2"),
        ("--mem=4G", "--mem-per-gpu=2G"),
        ("--mem-per-cpu=1G", "--mem=4G"),
        ("--mem-per-cpu=1G", "--mem-per-gpu=1G"),
        # with an option gpuq does not use: sbatch refuses the script all the same
        ("--exclusive", "--oversubscribe"),
        ("-s", "--exclusive"),
        ("--ntasks-per-node=2", "--ntasks-per-gpu=1"),
        ("--ntasks-per-gpu=1", "--gpus-per-task=1"),
        ("--core-spec=1", "--thread-spec=1"),
    ],
)
def test_pairs_sbatch_refuses_are_refused_naming_both(
    tmp_path: Path, first: str, second: str
) -> None:
    text = refusal(tmp_path, f"#SBATCH {first}", f"#SBATCH {second}")
    one, other = first.partition("=")[0], second.partition("=")[0]
    assert f"{other} (#SBATCH line 3)" in text and f"with {one} (#SBATCH line 2)" in text


def test_gres_with_gpus_in_all_is_what_slurm_takes(tmp_path: Path) -> None:
    assert spec(tmp_path, "#SBATCH --gres=gpu:2 --gpus=2").resources.gpus == 2


def test_sbatch_wait_makes_submit_wait(tmp_path: Path) -> None:
    assert asks_to_wait(Path(script(tmp_path, "#SBATCH -W")).read_text())
    assert asks_to_wait(Path(script(tmp_path, "#SBATCH --wait -t 5")).read_text())
    assert not asks_to_wait(Path(script(tmp_path, "#SBATCH -t 5")).read_text())
    text = refusal(tmp_path, "#SBATCH --wai")  # --wait or --wait-all-nodes
    assert "--wai is ambiguous: --wait, --wait-all-nodes" in text
    assert "--acc is ambiguous: --account, --acctg-freq" in refusal(tmp_path, "#SBATCH --acc=x")


def test_errors_name_the_option_as_written(tmp_path: Path) -> None:
    assert "invalid --gpus-per-node (#SBATCH line 2)" in refusal(
        tmp_path, "#SBATCH --gpus-per-node=1:x"
    )
    assert "invalid --gres (#SBATCH line 2)" in refusal(tmp_path, "#SBATCH --gres=gpu:x:y")
    assert "invalid -t (#SBATCH line 2)" in refusal(tmp_path, "#SBATCH -t soon")
    assert "invalid -p 'a b'" in refusal(tmp_path, partition="a b", spelled={"partition": "-p"})


# ---- --time in whole minutes, GPU types alone ----------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1", 60),
        ("0:05", 60),  # minutes:seconds, 5 seconds, rounded up
        ("1:30", 120),
        ("1:00", 60),
        ("0:0:1", 60),
        ("1:00:00", 3600),
        ("1:00:01", 3660),
        ("2-0", 2 * 86400),
        ("1-2", 86400 + 7200),
        ("1-2:30", 86400 + 7200 + 1800),
        ("1-0:0:1", 86400 + 60),
    ],
)
def test_time_limits_round_up_to_whole_minutes(text: str, seconds: int) -> None:
    assert parse_time_limit(text) == seconds
    assert build_spec(wrap="true", time=text).resources.time_limit == seconds


@pytest.mark.parametrize("text", ["0", "00:00", "0:0:0", "0-0", "-1", "UNLIMITED", "infinite"])
def test_what_sbatch_reads_as_no_time_limit_is_warned_not_refused(
    tmp_path: Path, text: str
) -> None:
    # sbatch's --time: a time of zero, -1, UNLIMITED and INFINITE all mean no limit (SLURM's
    # time_str2mins and arg_set_time_limit); gpuq keeps its default limit and says so
    for line in (f"#SBATCH --time={text}", f"#SBATCH -t {text}"):
        warnings: list[str] = []
        assert spec(tmp_path, line, warnings=warnings).resources.time_limit is None
        assert warnings == [
            f"#SBATCH {line[8:]} (line 2) is not used by gpuq: the default time limit applies"
        ]


def test_a_time_over_366_days_is_refused_as_written() -> None:
    with pytest.raises(InvalidInput) as info:
        build_spec(wrap="true", time="999999999999", spelled={"time": "-t"})
    assert str(info.value) == "invalid -t '999999999999': must be from 1 second to 366 days"


def test_an_int_time_is_seconds_exactly() -> None:
    assert build_spec(wrap="true", time=2).resources.time_limit == 2


@pytest.mark.parametrize(
    ("line", "gpu_type", "gpus"),
    [
        ("#SBATCH --gpus-per-node=a100", "a100", 1),
        ("#SBATCH --gpus-per-node=a100:2", "a100", 2),
        ("#SBATCH --gpus=h100", "h100", 1),
        ("#SBATCH -G A100-SXM4-80GB", "a100", 1),
        ("#SBATCH --gres=gpu:a100", "a100", 1),
        ("#SBATCH --gres=gpu:a100:3", "a100", 3),
        ("#GPUQ --gpus l4", "l4", 1),
    ],
)
def test_a_gpu_type_alone_is_one_gpu_of_it(
    tmp_path: Path, line: str, gpu_type: str, gpus: int
) -> None:
    resources = spec(tmp_path, line, warnings=[]).resources
    assert (resources.gpu_type, resources.gpus) == (gpu_type, gpus)


# ---- job names -------------------------------------------------------------------------------


def test_names_with_spaces_and_stars_are_taken_from_sbatch_lines(tmp_path: Path) -> None:
    built = spec(tmp_path, "#SBATCH --job-name='CS 601.471/671 homework5'")
    assert built.name == "CS 601.471/671 homework5"
    assert spec(tmp_path, "#SBATCH -J 'sweep *'").name == "sweep *"
    assert "control character" in refusal(tmp_path, name="a\x1b[2Jb")


def test_names_in_reasons_are_quoted_and_hidden_whole() -> None:
    name = "CS 601 it's, hw5"
    reason = f"singleton: job 4 named {name_in_text(name)} is running"
    assert reason == "singleton: job 4 named 'CS 601 it\\'s, hw5' is running"
    assert hide_names(reason) == "singleton: job 4 named (hidden) is running"
    change = f"updated: name {name_in_text('a b')} -> {name_in_text('plain')}; nice 1 -> 2"
    assert hide_names(change) == "updated: name (hidden) -> (hidden); nice 1 -> 2"
    assert name_in_text("plain-name_1.2") == "plain-name_1.2"


# ---- file-name patterns ----------------------------------------------------------------------

FIELDS = Fields(job_id=12, user="ada", name="CS 601.471/671 hw5", node="gpu01")


@pytest.mark.parametrize(
    ("pattern", "expanded"),
    [
        ("out.%J.%u", "out.12.ada"),  # %J: jobid.stepid, and the batch step adds nothing
        ("%j-%A-%a-%b", "12-12-0-0"),
        ("%s-%n-%t", "batch-0-0"),
        ("%N.out", "gpu01.out"),
        ("%x.out", "CS 601.471_671 hw5.out"),  # a / in a name never makes a folder
        ("%5j|%3a|%10J|%12j", "00012|000|0000000012|0000000012"),
        ("%3x|%4N|%2u", "CS 601.471_671 hw5|gpu01|ada"),  # names are not padded
        ("100%%-%%j", "100%-%j"),
        ("%q-%r-%5q-%", "%q-%r-%5q-%"),  # not sbatch patterns: as written
        ("a\\%j-%u", "a%j-%u"),  # a backslash: nothing expanded
    ],
)
def test_every_sbatch_file_name_pattern(pattern: str, expanded: str) -> None:
    assert expand(pattern, FIELDS) == expanded


def test_array_patterns_and_the_unstarted_tasks_record() -> None:
    task = Fields(job_id=40, user="u", name="n", node="n1", array_id=30, task=13)
    assert expand("%A_%a_%3a_%b_%j", task) == "30_13_013_3_40"
    record = Fields(job_id=30, user="u", name="n", node="unknown", array_id=30, task="%a")
    assert expand("%A_%a_%3a_%b", record) == "30_%a_%3a_%b"


def test_output_paths_put_stderr_apart_only_with_error() -> None:
    together = build_spec(wrap="true", chdir="/w", output="o-%J.txt", environ={})
    assert output_paths(together, 7, "ada", "n1") == ("/w/o-7.txt", "/w/o-7.txt")
    apart = build_spec(wrap="true", chdir="/w", error="/e/%x-%N.err", name="a/b", environ={})
    assert output_paths(apart, 7, "ada", "n1") == ("/w/gpuq-7.out", "/e/a_b-n1.err")


# ---- the README's table ----------------------------------------------------------------------


def test_the_readme_table_of_sbatch_support_is_the_codes() -> None:
    text = README.read_text()
    assert support_table() in text
    for long in USED:
        assert long in LONG  # gpuq uses only options sbatch has
    for short, long in SHORT.items():
        assert long in LONG and re.fullmatch(r"[A-Za-z]", short)


def test_the_dashboard_shows_names_as_text_never_as_html() -> None:
    """A name may hold `<`, `&` and quotes: the dashboard builds its page from DOM text
    nodes (textContent), never from HTML strings, so a name cannot become markup."""
    static = Path(__file__).parents[2] / "gpuq" / "web" / "static"
    for script in static.glob("*.js"):
        code = script.read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write"):
            assert sink not in code, f"{script.name} uses {sink}"
    assert "document.createTextNode(String(child))" in (static / "app.js").read_text()
    assert check_name("<b>x</b> & 'y'") == "<b>x</b> & 'y'"
