"""Every setting is checked when the config is read: a wrong one is one ConfigError naming the
file, the key and the value, before anything starts (issue 8: a string heartbeat_interval used to
reach an agent's registration and leave a phantom session behind)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuq.config.loading import load_settings
from gpuq.config.settings import Settings
from gpuq.config.value_checks import check_setting, redact_url
from gpuq.errors import ConfigError, InvalidInput


def load(tmp_path: Path, text: str) -> Settings:
    config = tmp_path / "config.toml"
    config.write_text(text)
    # the home from the file counts only without --home
    home = None if text.startswith("home") else tmp_path / "home"
    return load_settings(config, home=home)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("GPUQ_CONFIG", "GPUQ_DATABASE_URL", "GPUQ_COORDINATOR", "GPUQ_HOME"):
        monkeypatch.delenv(var, raising=False)


BAD = [
    # (config text, key named in the message, value as shown, words of the problem)
    (
        '[coordinator]\nservice_user = "gpuq svc"',
        "[coordinator] service_user",
        '"gpuq svc"',
        "a Unix user name",
    ),
    (
        '[coordinator]\nheartbeat_interval = "five"',
        "[coordinator] heartbeat_interval",
        '"five"',
        "not a string",
    ),
    (
        "[coordinator]\nheartbeat_interval = true",
        "[coordinator] heartbeat_interval",
        "true",
        "not a boolean",
    ),
    ("[coordinator]\nheartbeat_interval = 0", "[coordinator] heartbeat_interval", "0", "from 0.05"),
    (
        "[coordinator]\nheartbeat_interval = nan",
        "[coordinator] heartbeat_interval",
        "nan",
        "from 0.05",
    ),
    (
        "[coordinator]\nheartbeat_timeout = 1e12",
        "[coordinator] heartbeat_timeout",
        "1000000000000.0",
        "to 86400",
    ),
    (
        "[coordinator]\nheartbeat_timeout = 2.0",
        "[coordinator] heartbeat_timeout",
        "2.0",
        "longer than heartbeat_interval",
    ),
    ("[coordinator]\nkill_grace = -5", "[coordinator] kill_grace", "-5", "from 0 to 86400"),
    (
        '[coordinator]\nsqlite_synchronous = "sometimes"',
        "[coordinator] sqlite_synchronous",
        '"sometimes"',
        "one of OFF, NORMAL",
    ),
    ('[coordinator]\nlisten = "localhost"', "[coordinator] listen", '"localhost"', "HOST:PORT"),
    (
        '[coordinator]\nlisten = "0.0.0.0:70000"',
        "[coordinator] listen",
        '"0.0.0.0:70000"',
        "HOST:PORT",
    ),
    ("[coordinator]\nlisten = 7817", "[coordinator] listen", "7817", "not a whole number"),
    (
        '[coordinator]\ndatabase_url = "mysql://db/x"',
        "[coordinator] database_url",
        '"mysql://db/x"',
        "postgresql://",
    ),
    (
        '[coordinator]\ndatabase_url = "sqlite://"',
        "[coordinator] database_url",
        '"sqlite://"',
        "in-memory",
    ),
    (
        '[coordinator]\ndefault_qos = "gold"',
        "[coordinator] default_qos",
        '"gold"',
        "no such qos tier",
    ),
    (
        "[coordinator]\nheartbeat_intervall = 5",
        "[coordinator] heartbeat_intervall",
        "5",
        "did you mean heartbeat_interval",
    ),
    ("[agent]\ncpus = -4", "[agent] cpus", "-4", "from 1 to 65536"),
    ("[agent]\ncpus = 4.5", "[agent] cpus", "4.5", "not a number"),
    ("[agent]\ncpus = 100000000", "[agent] cpus", "100000000", "from 1 to 65536"),
    ('[agent]\nmem = "lots"', "[agent] mem", '"lots"', "expected a size"),
    ("[agent]\nmem = 2048", "[agent] mem", "2048", '"200G" (quoted)'),
    ('[agent]\nmem = "2P"', "[agent] mem", '"2P"', "at most 1P"),
    (
        '[agent]\nmem_enforcement = "bogus"',
        "[agent] mem_enforcement",
        '"bogus"',
        "one of auto, cgroup, poll",
    ),
    ('[agent]\nvisible_devices = "pci"', "[agent] visible_devices", '"pci"', "one of uuid, index"),
    ('[agent]\nnode_name = "../etc"', "[agent] node_name", '"../etc"', "letters, digits"),
    ('[agent]\ncoordinator = "head"', "[agent] coordinator", '"head"', "unix:PATH or HOST:PORT"),
    ('[agent]\nrun_dir = "spool"', "[agent] run_dir", '"spool"', "absolute path"),
    (
        '[agent]\ncgroup_parent = "../../escape"',
        "[agent] cgroup_parent",
        '"../../escape"',
        "cgroup path",
    ),
    ('[agent]\nfake_gpus = ""', "[agent] fake_gpus", '""', "a spec such as"),
    ("[agent.job_env]\nFOO = 1", "[agent.job_env] FOO", "1", "not a whole number"),
    ('[agent.job_env]\n"1BAD" = "x"', "[agent.job_env] 1BAD", '"x"', "environment variable name"),
    ("[qos.high]\npriority = 99999999999", "[qos.high] priority", "99999999999", "from -1000000"),
    ('[qos.high]\npreemptible = "yes"', "[qos.high] preemptible", '"yes"', "true or false"),
    ("[qos.high]\nmax_running_gpus = -1", "[qos.high] max_running_gpus", "-1", "from 0"),
    ("[qos.high]\nmax_time = 0", "[qos.high] max_time", "0", "from 1"),
    (
        "[qos.high]\nmax_time = 100\ndefault_time = 200",
        "[qos.high] default_time",
        "200",
        "max_time",
    ),
    ("[qos.high]\nmax_tme = 100", "[qos.high] max_tme", "100", "did you mean max_time"),
    ("[qos]\nhigh = 5", "[qos.high]", "5", "expected a table"),
    (
        "[qos.high]\nrequeue_on_node_fail = -1",
        "[qos.high] requeue_on_node_fail",
        "-1",
        "from 0 to 1000",
    ),
    ("[agent]\nfence_time = 0", "[agent] fence_time", "0", "from 0.1"),
    (
        "[agent]\nfence_time = 270",  # + the default grace and margin: past 300 s
        "[agent] fence_time",
        "270",
        "heartbeat_timeout (300 s) must be at least [agent] fence_time (270 s) + "
        "[coordinator] kill_grace (30 s) + 1 s = 301 s",
    ),
    (
        "[coordinator]\nheartbeat_timeout = 60\n[agent]\nfence_time = 40",
        "[coordinator] heartbeat_timeout",
        "60",
        "at least [agent] fence_time (40 s) + [coordinator] kill_grace (30 s) + 1 s = 71 s",
    ),
    (  # the default fence is too long for a shorter node timeout: lower it with it
        "[coordinator]\nheartbeat_timeout = 60",
        "[coordinator] heartbeat_timeout",
        "60",
        "= 271 s",
    ),
    (
        "[coordinator]\nkill_grace = 70",
        "[coordinator] kill_grace",
        "70",
        "+ [coordinator] kill_grace (70 s) + 1 s = 311 s",
    ),
    ("[scheduler]\nweight_age = -1", "[scheduler] weight_age", "-1", "from 0"),
    ("[scheduler]\npriority_interval = 0", "[scheduler] priority_interval", "0", "from 0.1"),
    (
        '[scheduler]\ncancel_unsatisfiable = "no"',
        "[scheduler] cancel_unsatisfiable",
        '"no"',
        "true or false",
    ),
    (
        "[scheduler]\nexplain_limit = 1e12",
        "[scheduler] explain_limit",
        "1000000000000.0",
        "to 1000000",
    ),
    ('coordinator = "x"', "[coordinator]", '"x"', "expected a table"),
    ("[coordinatr]\nlisten = 1", "coordinatr", "{...}", "did you mean coordinator"),
    ('home = "relative/path"', "home", '"relative/path"', "absolute path"),
]


@pytest.mark.parametrize(("text", "key", "shown", "problem"), BAD)
def test_a_bad_value_is_one_error_naming_key_and_value(
    tmp_path: Path, text: str, key: str, shown: str, problem: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, text)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"config {tmp_path / 'config.toml'}: {key} = {shown}: "), message
    assert problem in message, message
    assert caught.value.field == key


def test_a_config_error_is_bad_input(tmp_path: Path) -> None:
    """The CLI turns InvalidInput into exit code 2."""
    with pytest.raises(InvalidInput):
        load(tmp_path, '[coordinator]\nheartbeat_interval = "five"')


def test_good_values_are_normalised(tmp_path: Path) -> None:
    settings = load(
        tmp_path,
        "[coordinator]\n"
        "heartbeat_interval = 1\n"  # an integer where seconds are expected: fine
        'sqlite_synchronous = "full"\n'
        'listen = ""\n'  # Unix socket only
        'database_url = "postgresql://gpuq:secret@db:5432/gpuq"\n'
        'default_qos = "only"\n'
        "[agent]\n"
        'mem = "200G"\n'
        "cpus = 64\n"
        'coordinator = "head:7817"\n'
        'cgroup_parent = "/system.slice/gpuq"\n'
        "fence_time = 100\n"
        "[agent.job_env]\n"
        'PYTORCH_CUDA_ALLOC_CONF = "expandable_segments:False"\n'
        'NCCL_DEBUG = "WARN"\n'
        'TF_FORCE_GPU_ALLOW_GROWTH = ""\n'
        "[qos.only]\n"
        "priority = -5\n"
        "requeue_on_node_fail = 0\n"
        "max_running_gpus = 0\n"
        "default_time = 3600.0\n"  # a whole number written as a float
        "[scheduler]\n"
        "explain_limit = 10\n",
    )
    coordinator = settings.coordinator
    assert coordinator.heartbeat_interval == 1.0
    assert isinstance(coordinator.heartbeat_interval, float)
    assert coordinator.sqlite_synchronous == "FULL"
    assert coordinator.listen is None
    tier = coordinator.qos["only"]
    assert (tier.priority, tier.max_running_gpus, tier.default_time) == (-5, 0, 3600)
    assert tier.requeue_on_node_fail == 0
    assert coordinator.scheduler.explain_limit == 10
    agent = settings.agent
    assert agent.mem == "200G" and agent.cpus == 64 and agent.fence_time == 100.0
    # merged over the defaults: one changed, one added, one removed (empty), the rest kept
    assert agent.job_env == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False",
        "PYTORCH_ALLOC_CONF": "expandable_segments:False",  # one setting under two names
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "NCCL_DEBUG": "WARN",
    }


def test_default_qos_must_name_a_configured_tier(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[coordinator\] default_qos = \"normal\": no such"):
        load(tmp_path, "[qos.only]\npriority = 1\n")
    settings = load(tmp_path, '[coordinator]\ndefault_qos = "only"\n[qos.only]\npriority = 1\n')
    assert list(settings.coordinator.qos) == ["only"]


def test_defaults_need_no_file(tmp_path: Path) -> None:
    settings = load_settings(home=tmp_path / "home")
    assert settings.coordinator.heartbeat_interval == 5.0
    # SLURM's order of magnitude: an agent restart or a short network cut costs no job; an
    # agent cut off fences its jobs before the coordinator gives them up
    assert settings.coordinator.heartbeat_timeout == 300.0
    assert settings.agent.fence_time == 240.0
    assert all(t.requeue_on_node_fail == 1 for t in settings.coordinator.qos.values())


@pytest.mark.parametrize(
    ("var", "value", "problem"),
    [
        ("GPUQ_DATABASE_URL", "postgres://u:secret@db/x", "write postgresql://"),
        ("GPUQ_DATABASE_URL", "not a url", "expected sqlite:///PATH"),
        ("GPUQ_COORDINATOR", "head", "unix:PATH or HOST:PORT"),
        ("GPUQ_COORDINATOR", "head:0", "unix:PATH or HOST:PORT"),
    ],
)
def test_environment_overrides_are_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, var: str, value: str, problem: str
) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError) as caught:
        load_settings(home=tmp_path / "home")
    message = str(caught.value)
    assert message.startswith(f"environment: {var} = "), message
    assert problem in message and "secret" not in message


def test_environment_overrides_apply(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUQ_DATABASE_URL", "postgresql://gpuq@db/gpuq")
    monkeypatch.setenv("GPUQ_COORDINATOR", "unix:/run/gpuq.sock")
    settings = load_settings(home=tmp_path / "home")
    assert settings.database_url == "postgresql://gpuq@db/gpuq"
    assert settings.coordinator_address == "unix:/run/gpuq.sock"


def test_flags_obey_the_same_rules() -> None:
    with pytest.raises(ConfigError, match=r"^command line: --node-name = \"a/b\": expected"):
        check_setting("agent", "node_name", "a/b", "command line", "--node-name")
    with pytest.raises(ConfigError, match=r"--listen = \"nowhere\""):
        check_setting("coordinator", "listen", "nowhere", "command line", "--listen")
    assert check_setting("agent", "mem", "40G", "command line") == "40G"


def test_passwords_are_never_shown() -> None:
    assert redact_url("postgresql://gpuq:s3cr3t@db:5432/x") == "postgresql://gpuq:***@db:5432/x"
    assert redact_url("postgresql://gpuq@db/x") == "postgresql://gpuq@db/x"
    assert redact_url("sqlite:////var/lib/gpuq/gpuq.db") == "sqlite:////var/lib/gpuq/gpuq.db"


def test_unreadable_toml_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="config"):
        load(tmp_path, "[coordinator\nlisten = ")


GPUQ = [sys.executable, "-m", "gpuq.cli.main"]


@pytest.mark.parametrize(
    "text",
    [
        '[coordinator]\nheartbeat_interval = "five"',
        "[agent]\ncpus = -4",
        '[agent]\nmem_enforcement = "bogus"',
        "[qos.x]\npriority = true\n[coordinator]\ndefault_qos = 'x'",
    ],
)
def test_cli_says_one_line_and_exits_2(tmp_path: Path, text: str) -> None:
    """No traceback: `gpuq` itself, as a user runs it (no coordinator needed to fail early)."""
    config = tmp_path / "config.toml"
    config.write_text(text)
    for command in (["queue"], ["coordinator"], ["agent"]):
        result = subprocess.run(
            [*GPUQ, "--home", str(tmp_path / "home"), "--config", str(config), *command],
            capture_output=True,
            text=True,
            timeout=60,
            # the session's runtime folder: the helper this first call starts is stopped at
            # the end (conftest), not left in /tmp/gpuq-cli-UID
            env={"PATH": "/usr/bin:/bin", "XDG_RUNTIME_DIR": os.environ["XDG_RUNTIME_DIR"]},
        )
        assert result.returncode == 2, result
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        assert lines[0].startswith(f"gpuq: error: config {config}: ["), lines[0]


@pytest.mark.parametrize(
    ("text", "private"),
    [
        ("", ()),
        ('private_data = ["names", "usage"]', ("names", "usage")),
        ("hide_job_names = true", ("names",)),  # the old spelling keeps its meaning
        ("hide_job_names = false", ()),
        ('hide_job_names = true\nprivate_data = ["usage"]', ("usage", "names")),
    ],
)
def test_private_data_and_the_old_hide_job_names(
    tmp_path: Path, text: str, private: tuple[str, ...]
) -> None:
    assert load(tmp_path, f"[coordinator]\n{text}\n").coordinator.private_data == private


def test_private_data_names_its_vocabulary(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r'private_data.*"jobs".*expected "names", "usage"'):
        load(tmp_path, '[coordinator]\nprivate_data = ["jobs"]\n')


def test_clients_find_the_machines_coordinator_with_no_config_of_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user with no config and no coordinator of their own reaches the machine's (the
    installed one's socket in /var/lib/gpuq); their own `gpuq serve` wins where it listens;
    [client] coordinator, else the older [agent] coordinator, wins over both."""
    import gpuq.config.settings as settings_module

    system = tmp_path / "system"
    system.mkdir()
    monkeypatch.setattr(settings_module, "SYSTEM_HOME", system)
    mine = load(tmp_path, "")
    assert mine.client_address() == f"unix:{mine.socket_path}"  # none listens: say how to start
    (system / "gpuq.sock").touch()
    assert mine.client_address() == f"unix:{system / 'gpuq.sock'}"
    mine.home.mkdir()
    mine.socket_path.touch()  # the user's own gpuq serve
    assert mine.client_address() == f"unix:{mine.socket_path}"
    assert load(tmp_path, '[agent]\ncoordinator = "head:7817"').client_address() == "head:7817"
    both = '[agent]\ncoordinator = "head:7818"\n[client]\ncoordinator = "head:7817"'
    settings = load(tmp_path, both)
    assert (settings.client_address(), settings.coordinator_address) == ("head:7817", "head:7818")
    monkeypatch.setenv("GPUQ_COORDINATOR", "unix:/run/x.sock")  # a job's own gpuq: it wins
    assert load(tmp_path, both).client_address() == "unix:/run/x.sock"
