"""metrics/prometheus.py: a progress record served to Prometheus, scraped over HTTP and read back with
prometheus-client's own parser: the figures, each test net's last test kept across scrapes, a damaged field left
out, loopback by default, a port in use one line."""
import socket
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pycaffe_dist.errors import PycaffeDistError
from pycaffe_dist.metrics.prometheus import MetricsServer
from pycaffe_dist.metrics.record import Latest


def scrape(port, host="127.0.0.1"):
    """{(name, ((label, value), ...)): value} of one scrape."""
    text = urllib.request.urlopen("http://%s:%d/metrics" % (host, port), timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name.startswith("dist_caffe_")}


def listening_address(port):
    """The local address of the socket listening on TCP `port` (Linux's /proc/net/tcp), as dotted quad."""
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:
                return socket.inet_ntoa(bytes.fromhex(address)[::-1])
    return None


RECORD = {"job": "j1", "mode": "async", "count": 40, "max_iter": 100, "loss": 0.5, "started": True,
          "elapsed_s": 4.0, "workers": {"0": 30.0, "1": 10.0}, "exchange_share": 0.125, "mean_staleness": 1.5,
          "test": {"iter": 40, "net": 1, "time_s": 3.9, "scores": {"accuracy": 0.75, "loss": 0.5}}, "snapshots": []}


@pytest.fixture
def served():
    latest = Latest()
    server = MetricsServer(0, "127.0.0.1", latest.get)
    yield latest, server.port
    server.close()


def test_a_scrape_has_the_records_figures(served):
    latest, port = served
    assert scrape(port) == {}                                   # no record yet: nothing, and no error
    latest(dict(RECORD, test={"iter": 30, "net": 0, "scores": {"accuracy": 0.5}}))
    latest(RECORD)      # (the launcher hands every record over; a scrape sees the newest)
    assert scrape(port) == {
        ("dist_caffe_info", (("job", "j1"), ("mode", "async"))): 1.0,
        ("dist_caffe_started", ()): 1.0, ("dist_caffe_iteration", ()): 40.0, ("dist_caffe_max_iter", ()): 100.0,
        ("dist_caffe_loss", ()): 0.5, ("dist_caffe_elapsed_seconds", ()): 4.0,
        ("dist_caffe_exchange_share", ()): 0.125, ("dist_caffe_mean_staleness", ()): 1.5,
        ("dist_caffe_images_per_second", ()): 40.0, ("dist_caffe_workers", ()): 2.0,
        ("dist_caffe_worker_images_per_second", (("worker", "0"),)): 30.0,
        ("dist_caffe_worker_images_per_second", (("worker", "1"),)): 10.0,
        ("dist_caffe_test_iteration", (("net", "1"),)): 40.0,
        ("dist_caffe_test_output", (("net", "1"), ("output", "accuracy"))): 0.75,
        ("dist_caffe_test_output", (("net", "1"), ("output", "loss"))): 0.5}


def test_each_test_nets_last_test_is_kept_across_scrapes(served):
    latest, port = served
    latest(dict(RECORD, test={"iter": 30, "net": 0, "scores": {"accuracy": 0.5}}))
    scrape(port)
    latest(RECORD)                                              # net 1's test replaced net 0's in the record
    got = scrape(port)
    assert got[("dist_caffe_test_output", (("net", "0"), ("output", "accuracy")))] == 0.5
    assert got[("dist_caffe_test_iteration", (("net", "0"),))] == 30.0
    assert got[("dist_caffe_test_output", (("net", "1"), ("output", "accuracy")))] == 0.75


def test_a_damaged_field_is_left_out_and_the_rest_served(served):
    latest, port = served
    latest(dict(RECORD, loss="low", count=True, workers={"0": 30.0, "1": [1]}, test={"iter": "x", "scores": {}}))
    got = scrape(port)
    assert ("dist_caffe_loss", ()) not in got and ("dist_caffe_iteration", ()) not in got
    assert got[("dist_caffe_workers", ())] == 1.0 and got[("dist_caffe_images_per_second", ())] == 30.0
    assert not any(name.startswith("dist_caffe_test") for name, _ in got)


def test_a_pipelines_images_are_one_stages(served):
    latest, port = served
    latest(dict(RECORD, mode="pipeline", workers={"0": 64.0, "1": 64.0}))
    assert scrape(port)[("dist_caffe_images_per_second", ())] == 64.0


def test_it_listens_on_loopback_and_a_port_in_use_is_one_line(served):
    _, port = served
    assert listening_address(port) == "127.0.0.1"
    with pytest.raises(PycaffeDistError, match=r"--metrics-port %d: cannot serve metrics on 127.0.0.1: " % port):
        MetricsServer(port, "127.0.0.1", dict)
