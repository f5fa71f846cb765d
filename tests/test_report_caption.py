"""A study's report is captioned with the settings its sweep runs unlike the suite's defaults (the sweep file's
`study_settings`), which are data the report reads, not part of any point."""

import pytest

import suite.paths as paths
import suite.sweep.sweep_files as sweep_files
from analysis.report import study_settings_table, write_report
from suite.errors import ConfigError


class EmptyStore:
    client = None

    def runs(self, experiment):
        return []


@pytest.mark.parametrize(("sweep", "settings"), [
    ("study_n", ["math.tf32=true", "DeepSpeed's pure fp16", "1F1B (extension) in fp32", "DDP+Adam"]),
    ("study_j", ["math.cudnn_benchmark=true", "warmup_steps=0"]),
    ("study_j_mini", ["warmup_steps=0", "dataset.loader_workers=0"]),
])
def test_the_caption_lists_each_study_setting_with_its_source(tmp_path, sweep, settings):
    report = write_report(EmptyStore(), sweep, out_dir=tmp_path)
    caption = (tmp_path / "report.md").read_text().split("\n## ")[0]
    assert "settings this sweep runs unlike the suite's defaults" in caption
    for setting in settings:
        assert setting in caption
    rows = study_settings_table(sweep, sweep).rows
    assert all(source for _, source in rows)
    assert tmp_path / "study_settings.tex" in report.files


def test_a_sweep_without_study_settings_has_no_caption(tmp_path):
    assert study_settings_table("digits", "digits") is None
    write_report(EmptyStore(), "digits", out_dir=tmp_path)
    assert "unlike the suite's defaults" not in (tmp_path / "report.md").read_text()


def test_study_settings_must_each_be_a_setting_and_its_source(tmp_path, monkeypatch):
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "captioned.yaml").write_text("points:\n  - workers=1\nstudy_settings:\n  - tf32 on\n")
    monkeypatch.setattr(paths, "CONF_DIR", tmp_path)
    with pytest.raises(ConfigError, match="study_settings is not a list of `setting: ..., source: ...` entries"):
        sweep_files.sweep_file("captioned")
