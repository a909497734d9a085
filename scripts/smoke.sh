#!/usr/bin/env bash
# Smoke check against a running service at $BASE_URL (used by container-check in CI):
# POSTs the worked examples and checks the numbers against the golden PyTorch fixtures.
set -euo pipefail
python3 "$(dirname "$0")/smoke.py" "${BASE_URL:?BASE_URL is not set}"
