"""The mode options: declared once in the mode modules, checked and defaulted by resolve_options, and the command
line's flags built from the declarations."""
import pytest

from pycaffe_dist.cli import build_parser
from pycaffe_dist.cli.distributed import mode_options
from pycaffe_dist.distributed.data_parallel.modes import MODES, all_options, resolve_options
from pycaffe_dist.errors import PycaffeDistError
from tests.cli.commands import assert_clean_error, dist_caffe
from tests.conftest import REPO


SCALING = {"lr_scaling": "linear", "lr_warmup": 0.02, "lars": None}     # every data-parallel mode's


def test_defaults_come_from_the_declarations():
    assert resolve_options("async", {}) == dict(SCALING, tau=1, factor=None, overlap=None, compress="none")
    assert resolve_options("easgd", {"tau": 3}) == dict(SCALING, tau=3, moving_rate=None, overlap=None)
    assert resolve_options("gradient-only", {}) == dict(SCALING, factor=None, overlap=None, compress="none")
    assert resolve_options("sync", {}) == dict(SCALING, tau=1, backup=0, overlap=None, compress="none")
    assert resolve_options("local-sgd", {}) == dict(SCALING, tau=8, outer_lr=1.0, outer_momentum=None, backup=0,
                                                    overlap=None, compress="none")
    for mode, module in MODES.items():                  # every mode runs with no options at all
        assert set(resolve_options(mode, {})) == {o.name for o in module.OPTIONS}


@pytest.mark.parametrize("mode, given, message", [
    ("async", {"tau": 0}, "--tau must be at least 1, got 0"),
    ("async", {"factor": -1}, "--factor must be positive, got -1"),
    ("easgd", {"moving_rate": 1.5}, r"--moving-rate must be in \(0, 1\], got 1.5"),
    ("partial-sync", {"max_advance": -1}, "--max-advance must be at least 0"),
    ("weed-out", {"weedout": 0}, "--weedout must be at least 1, got 0"),
    ("sync", {"backup": -1}, "--backup must be at least 0, got -1"),
    ("local-sgd", {"outer_momentum": 1.0}, r"--outer-momentum must be in \[0, 1\), got 1.0"),
    ("local-sgd", {"outer_lr": 0}, "--outer-lr must be positive, got 0"),
    ("sync", {"outer_lr": 0.7}, r"--outer-lr is not an option of mode sync \(it is of local-sgd;"),
    ("sync", {"factor": 4}, "--factor is not an option of mode sync .* sync takes --tau, --backup, --overlap, "
                            "--compress"),
    ("easgd", {"compress": "1bit"}, r"--compress is not an option of mode easgd \(it is of sync, async, "
                                    "gradient-only, local-sgd;"),
    ("sync", {"compress": "2bit"}, "--compress must be none, 1bit or topk:FRACTION with 0 < FRACTION <= 1, got '2bit'"),
    ("async", {"compress": "topk:0"}, "--compress must be none, 1bit or topk:FRACTION"),
    ("easgd", {"backup": 1}, "--backup is not an option of mode easgd"),
    ("gradient-only", {"tau": 3}, "--tau is not an option of mode gradient-only"),
    ("chaos", {}, "unknown mode 'chaos'"),
])
def test_bad_options_are_refused_with_the_flag_named(mode, given, message):
    with pytest.raises(PycaffeDistError, match=message):
        resolve_options(mode, given)


def test_an_other_modes_option_at_its_default_is_accepted():
    """The Ansible role passes --tau 1 whatever the mode."""
    assert resolve_options("gradient-only", {"tau": 1}) == dict(SCALING, factor=None, overlap=None, compress="none")


@pytest.mark.parametrize("verb", [["train", "--solver", "s"], ["master"]])
def test_every_declared_option_is_a_flag_of_train_and_master(verb):
    parser = build_parser()
    argv = verb + ["--tau", "2", "--factor", "0.5", "--max-advance", "3", "--weedout", "4", "--moving-rate", "0.2",
                   "--backup", "1", "--no-overlap", "--outer-lr", "0.7", "--outer-momentum", "0.9",
            "--compress", "topk:0.01", "--lr-scaling", "sqrt", "--lr-warmup", "0.1", "--lars", "0.02"]
    args = parser.parse_args(argv)
    assert mode_options(args) == {"tau": 2, "factor": 0.5, "max_advance": 3, "weedout": 4, "moving_rate": 0.2,
                                  "backup": 1, "overlap": False, "outer_lr": 0.7, "outer_momentum": 0.9,
                                  "compress": "topk:0.01", "lr_scaling": "sqrt", "lr_warmup": 0.1, "lars": 0.02}
    assert mode_options(parser.parse_args(verb)) == {}
    assert len(all_options()) == 13


def test_train_refuses_a_bad_option_in_one_line_before_starting_anything():
    run = dist_caffe("train", "--solver", "prototxt/lenet_solver.prototxt", "--workers", 2, "--mode", "sync",
                     "--factor", 3, cwd=REPO)
    assert_clean_error(run, "--factor is not an option of mode sync")
    assert "[master]" not in run.stderr                       # refused by the launcher itself
    assert_clean_error(dist_caffe("train", "--solver", "prototxt/lenet_solver.prototxt", "--tau", 2, cwd=REPO),
                       "--tau: options of the distributed modes: give --workers N")


@pytest.mark.parametrize("extra, message", [
    (["--mode", "sync", "--backup", 2], "--backup 2 leaves no worker to wait for: give fewer backups than --workers"),
    (["--slow-worker", "5:1"], "--slow-worker names worker 5, but the workers are 0 to 1"),
])
def test_train_refuses_backups_and_slow_workers_it_cannot_have(extra, message):
    run = dist_caffe("train", "--solver", "prototxt/lenet_solver.prototxt", "--workers", 2, *extra, cwd=REPO)
    assert_clean_error(run, message)
    assert "[master]" not in run.stderr
