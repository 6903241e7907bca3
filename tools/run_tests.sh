#!/usr/bin/env bash
# Set up and run the test suite on a fresh machine (Python 3.10+, gcc, the package registries), from a plain clone:
# the tests' data is in tests/fixtures.
# The README's test command, and what .ci/run calls. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

# Fashion-MNIST for the tests that train on real data and Graphviz for `draw` (Debian's packages; without them
# those tests are skipped).
if { [ ! -d /usr/share/datasets/fashion-mnist ] || ! command -v dot >/dev/null; } && command -v apt-get >/dev/null
then
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
    ($sudo apt-get update -qq && $sudo apt-get install -y -qq dataset-fashion-mnist graphviz) \
        || echo "run_tests: could not install dataset-fashion-mnist and graphviz; their tests will be skipped" >&2
fi
# Build the package and its Cython kernels in place (editable), with the test requirements.
python3 -m pip install --quiet --disable-pip-version-check -e ".[test]"
python3 -m pytest -q -p no:cacheprovider "$@"
