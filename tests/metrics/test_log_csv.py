"""metrics/log_csv.py: `plot --csv` writes Caffe's parse_log.py tables (LOG.train, LOG.test) of our logs and of
Caffe's, with and without glog's time prefixes."""
import csv
import datetime
import re

from pycaffe_dist.metrics.log_csv import tables, write_tables
from pycaffe_dist.solver.training_log import parse_log
from tests.cli.commands import assert_clean_error, dist_caffe
from tests.conftest import GOLDEN

# A Caffe log as glog writes it, over midnight, the rate stepping down. Its tables are what Caffe's own parse_log.py
# wrote for it (run once by hand), but for NumIters, which Caffe's writes as 0.0, 10.0, ...
CAFFE_LOG = """\
I1121 23:59:58.000100  4242 caffe.cpp:197] Use CPU.
I1121 23:59:58.500000  4242 solver.cpp:45] Initializing solver from parameters:
test_iter: 2
I1121 23:59:59.000000  4242 solver.cpp:288] Solving LeNet
I1121 23:59:59.000010  4242 solver.cpp:289] Learning Rate Policy: step
I1121 23:59:59.100000  4242 solver.cpp:347] Iteration 0, Testing net (#0)
I1121 23:59:59.600000  4242 solver.cpp:414]     Test net output #0: accuracy = 0.1
I1121 23:59:59.600001  4242 solver.cpp:414]     Test net output #1: loss = 2.30259 (* 1 = 2.30259 loss)
I1121 23:59:59.700000  4242 solver.cpp:239] Iteration 0 (0 iter/s, 0.6s/10 iters), loss = 2.31
I1121 23:59:59.700001  4242 solver.cpp:258]     Train net output #0: loss = 2.31 (* 1 = 2.31 loss)
I1121 23:59:59.700002  4242 sgd_solver.cpp:112] Iteration 0, lr = 0.01
I1122 00:00:01.250000  4242 solver.cpp:239] Iteration 10 (6.45 iter/s, 1.55s/10 iters), loss = 1.5
I1122 00:00:01.250001  4242 solver.cpp:258]     Train net output #0: loss = 1.4 (* 1 = 1.4 loss)
I1122 00:00:01.250002  4242 sgd_solver.cpp:112] Iteration 10, lr = 0.001
I1122 00:00:02.000000  4242 solver.cpp:347] Iteration 20, Testing net (#0)
I1122 00:00:02.400000  4242 solver.cpp:414]     Test net output #0: accuracy = 0.75
I1122 00:00:02.400001  4242 solver.cpp:414]     Test net output #1: loss = 0.9 (* 1 = 0.9 loss)
I1122 00:00:02.500000  4242 solver.cpp:239] Iteration 20 (8 iter/s, 1.25s/10 iters), loss = 0.8
I1122 00:00:02.500001  4242 solver.cpp:258]     Train net output #0: loss = 0.7 (* 1 = 0.7 loss)
I1122 00:00:02.500002  4242 sgd_solver.cpp:112] Iteration 20, lr = 0.0001
I1122 00:00:03.000000  4242 solver.cpp:347] Iteration 30, Testing net (#0)
I1122 00:00:03.400000  4242 solver.cpp:414]     Test net output #0: accuracy = 0.8
I1122 00:00:03.400001  4242 solver.cpp:414]     Test net output #1: loss = 0.6 (* 1 = 0.6 loss)
I1122 00:00:03.500000  4242 solver.cpp:464] Optimization Done.
"""
CAFFE_TRAIN = """\
NumIters,Seconds,LearningRate,loss
0,0.700001,0.01,2.31
10,2.250001,0.01,1.4
20,3.500001,0.001,0.7
"""
CAFFE_TEST = """\
NumIters,Seconds,LearningRate,accuracy,loss
0,0.6,0.001,0.1,2.30259
20,3.4,0.001,0.75,0.9
30,4.4,0.0001,0.8,0.6
"""


def read_table(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


def test_a_caffe_log_gives_the_tables_caffes_parse_log_gives(tmp_path):
    (tmp_path / "caffe.INFO").write_text(CAFFE_LOG)
    out = tmp_path / "tables"
    out.mkdir()
    written = write_tables(str(tmp_path / "caffe.INFO"), parse_log(tmp_path / "caffe.INFO"), str(out))
    assert written == [str(out / "caffe.INFO.train"), str(out / "caffe.INFO.test")]
    assert (out / "caffe.INFO.train").read_text().replace("\r\n", "\n") == CAFFE_TRAIN
    assert (out / "caffe.INFO.test").read_text().replace("\r\n", "\n") == CAFFE_TEST


def test_our_log_through_plot_csv(trained, tmp_path):
    run = dist_caffe("plot", "--csv", trained.log, "--csv-dir", tmp_path, "-o", tmp_path / "plot.png")
    assert run.returncode == 0, run.stderr
    assert "wrote %s" % (tmp_path / "train.log.train") in run.stdout
    text = trained.log.read_text()
    header, train = read_table(tmp_path / "train.log.train")
    assert header == ["NumIters", "Seconds", "LearningRate", "loss"]
    assert [int(r[0]) for r in train] == [0, 5, 10, 15]
    assert [float(r[3]) for r in train] == [float(v) for v in re.findall(r"Train net output #0: loss = (\S+)", text)]
    # the rate of the last lr line before each row (Caffe's lag of a display), the first row's from the second
    assert [float(r[2]) for r in train] == [0.05, 0.05, 0.05, 0.025]
    header, test = read_table(tmp_path / "train.log.test")
    assert header == ["NumIters", "Seconds", "LearningRate", "accuracy", "loss"]
    assert [int(r[0]) for r in test] == [0, 10, 20]
    assert [float(r[3]) for r in test] == [float(v) for v in re.findall(r"output #0: accuracy = (\S+)", text)]
    assert [float(r[4]) for r in test] == [float(v) for v in re.findall(r"output #1: loss = (\S+)", text)]
    # seconds since the Solving line, from glog's prefix (the first test's first line)
    stamps = {}
    for m in re.finditer(r"^I(\d{4} [\d:.]+) .*?\] (Solving|    Test net output #0)", text, re.M):
        stamps.setdefault(m.group(2), datetime.datetime.strptime(m.group(1), "%m%d %H:%M:%S.%f"))
    assert float(test[0][1]) == (stamps["    Test net output #0"] - stamps["Solving"]).total_seconds()
    seconds = [float(r[1]) for r in train]
    assert seconds == sorted(seconds) and seconds[0] >= 0


def test_a_log_without_times_has_rows_without_seconds(tmp_path):
    """Caffe's golden logs have glog's prefix cut to the severity and the source line: the rows are there (Caffe's
    parse_log skips every such line), without seconds; the rates follow Caffe's rule, read here line by line."""
    log = GOLDEN / "solvers" / "sgd_lr_step" / "caffe_train.log"
    train, test = tables(parse_log(log))
    lines = log.read_text().splitlines()
    want, rate = [], float("nan")
    for line in lines:
        m = re.search(r"lr = (\S+)", line)
        rate = float(m.group(1)) if m else rate
        m = re.search(r"Train net output #0: loss = (\S+)", line)
        if m:
            want.append((rate, float(m.group(1))))
    want[0] = (want[1][0], want[0][1])
    assert [(r["LearningRate"], r["loss"]) for r in train] == want
    assert [r["NumIters"] for r in train] == list(range(10)) and {r["Seconds"] for r in train + test} == {None}
    assert [r["NumIters"] for r in test] == [0, 5, 10]
    assert len({rate for rate, _ in want}) > 1         # (the step policy moved it: the rule was tried)
    write_tables(str(log), parse_log(log), str(tmp_path))
    assert read_table(tmp_path / "caffe_train.log.train")[1][0][:3] == ["0", "", repr(want[0][0])]


def test_a_distributed_masters_log_has_the_display_loss_as_its_train_table():
    """Our masters log the display line, not the train net's outputs (they have no train net running)."""
    log = {"train": [(10, None, 1.5), (20, None, 0.5)], "lr": [], "outputs": [], "solving": None,
           "test": [(20, None, 0, "accuracy", 0.75)]}
    train, test = tables(log)
    assert [(r["NumIters"], r["loss"]) for r in train] == [(10, 1.5), (20, 0.5)]
    assert [(r["NumIters"], r["accuracy"]) for r in test] == [(20, 0.75)]       # (the only row: written)


def test_several_test_nets_have_a_row_per_net_and_test():
    log = {"train": [], "lr": [(0, 0.0, 0.1)], "outputs": [], "solving": 0.0,
           "test": [(0, 1.0, 0, "accuracy", 0.25), (0, 1.0, 0, "loss", 2.0), (0, 2.0, 1, "accuracy", 0.5),
                    (0, 2.0, 1, "loss", 1.0), (5, 3.0, 0, "accuracy", 0.75), (5, 3.0, 0, "loss", 0.5),
                    (5, 4.0, 1, "accuracy", 1.0), (5, 4.0, 1, "loss", 0.25)]}
    _, test = tables(log)
    assert [(r["NumIters"], r["Seconds"], r["accuracy"], r["loss"]) for r in test] == [
        (0, 1.0, 0.25, 2.0), (0, 2.0, 0.5, 1.0), (5, 3.0, 0.75, 0.5), (5, 4.0, 1.0, 0.25)]
    assert [r["LearningRate"] for r in test] == [0.1] * 4


def test_a_missing_folder_is_one_line(tmp_path):
    (tmp_path / "caffe.INFO").write_text(CAFFE_LOG)
    assert_clean_error(dist_caffe("plot", tmp_path / "caffe.INFO", "--csv-dir", tmp_path / "nowhere"),
                       "--csv-dir %s: no such folder" % (tmp_path / "nowhere"))


def test_plot_csv_writes_beside_the_log_by_default(tmp_path):
    (tmp_path / "caffe.INFO").write_text(CAFFE_LOG)
    run = dist_caffe("plot", "--csv", tmp_path / "caffe.INFO")
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "caffe.INFO.train").read_text().replace("\r\n", "\n") == CAFFE_TRAIN
    assert (tmp_path / "caffe.png").exists()                   # (the plot: the log name with .png for .INFO)
