"""``TrainConfig`` in sections: every flag has one home ([Note: flags]), flags go in and come
back out unchanged, sizes are parsed once into ``memory.*_bytes``, and None/0 mean the same for
the disk tier as in ``GeminiConfig`` ([Note: budgets])."""

from __future__ import annotations

from pathlib import Path

import pytest

from colossal import GeminiPlugin, TrainConfig, build_plugin
from colossal.train._sections import FLAGS, SECTIONS, flag_defaults
from colossal_contracts import ConfigError


def test_every_flag_has_one_field_and_every_field_one_flag():
    homes = list(FLAGS.values())
    assert len(set(homes)) == len(homes)
    fields = {(name, f) for name, cls in SECTIONS.items() for f in cls.__dataclass_fields__}
    assert set(homes) == fields


def test_flags_round_trip_and_sections_hold_them():
    cfg = TrainConfig.from_flags(
        steps=7, batch_size=4, seq_len=32, tp=1, accelerator_budget="2MiB", data="corpus.txt"
    )
    assert cfg.training.steps == 7 and cfg.data.batch_size == 4 and cfg.data.seq_len == 32
    assert cfg.memory.accelerator_bytes == 2 << 20  # parsed once, here
    assert cfg.data.path == Path("corpus.txt")
    assert cfg.parallel.plugin == "gemini" and cfg.parallel.zero == 3  # resolved
    assert TrainConfig.from_flags(**cfg.flags()) == cfg
    assert set(cfg.flags()) == set(FLAGS)


def test_defaults_are_the_sections_defaults():
    assert TrainConfig() == TrainConfig.from_flags()
    d = flag_defaults()
    assert d["steps"] == 200 and d["disk_budget"] == 0 and d["accelerator_budget"] is None
    assert {k: v for k, v in TrainConfig().flags().items() if k not in ("plugin", "zero")} == {
        k: v for k, v in d.items() if k not in ("plugin", "zero")
    }


def test_replace_changes_flags_and_validates_again():
    cfg = TrainConfig.from_flags(steps=5, zero=1)
    more = cfg.replace(steps=9)
    assert (more.training.steps, more.parallel.plugin, more.parallel.zero_stage) == (9, "zero", 1)
    assert cfg.training.steps == 5  # frozen: a new config
    with pytest.raises(ConfigError, match="--lr must be positive"):
        cfg.replace(lr=0.0)


def test_corpus_is_the_older_name_of_data():
    assert TrainConfig.from_flags(corpus="a.txt").data.path == Path("a.txt")
    assert TrainConfig.from_flags(corpus="a.txt", data="a.txt").data.path == Path("a.txt")
    with pytest.raises(ConfigError, match="disagree"):
        TrainConfig.from_flags(corpus="a.txt", data="b.txt")


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        ({"stepz": 3}, "unknown TrainConfig setting"),
        ({"steps": "3"}, "TrainConfig.steps must be int"),
        ({"accelerator_budget": "lots"}, "cannot read 'lots' as a size"),
        ({"host_budget": -1}, "--host-budget must be >= 0"),
        ({"disk_budget": None}, "--disk-budget needs a size"),
        ({"disk_dir": "."}, "--disk-dir needs --disk-budget"),
        ({"plugin": "zero", "disk_budget": "1GiB"}, "applies to --plugin gemini only"),
    ],
)
def test_bad_flags_are_one_line_config_errors(flags, match):
    with pytest.raises(ConfigError, match=match) as err:
        TrainConfig.from_flags(**flags)
    assert "\n" not in str(err.value)


def test_sections_are_checked_when_built_directly():
    from colossal.train._sections import DataSection

    with pytest.raises(ConfigError, match="--batch-size must be positive"):
        DataSection(batch_size=0)
    with pytest.raises(ConfigError, match=r"TrainConfig\.data must be a DataSection"):
        TrainConfig(data={"batch_size": 4})  # type: ignore[arg-type]


def test_the_disk_budget_means_the_same_in_the_job_and_in_gemini(tmp_path):
    """0: no disk tier (the default of both); a size: that many bytes, the same in the plugin
    the job builds."""
    plain = build_plugin("gemini", TrainConfig.from_flags())
    assert isinstance(plain, GeminiPlugin) and plain.config.disk_bytes == 0
    cfg = TrainConfig.from_flags(disk_budget="1MiB", disk_dir=tmp_path, host_budget="1MiB")
    plugin = build_plugin("gemini", cfg)
    assert isinstance(plugin, GeminiPlugin)
    assert plugin.config.disk_bytes == cfg.memory.disk_bytes == 1 << 20
    assert plugin.config.host_bytes == 1 << 20
