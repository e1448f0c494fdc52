#!/usr/bin/env bash
# Run hamq through the peer-broker benchmark steps (see ../shared/peers/README.md) and write
# $PEERS_DIR/results/hamq-latest.json (+ a timestamped copy) in the peers' JSON layout, so
# ../shared/peers/summarize.py lists hamq next to RabbitMQ and NATS.
#
#   bench/compare_peers.sh --runs 3                       # all four setups, peers' parameters
#   bench/compare_peers.sh --runs 1 --setups single       # quick check
#
# Options are those of bench/compare_peers.py (--help). Do not run it while the peers'
# run_all.sh is running: they share the machine's CPUs and disk.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
PY="$REPO/.venv/bin/python"
[ -x "$PY" ] || { echo "no venv at $REPO/.venv (run make in $REPO first)" >&2; exit 1; }
[ -x "$REPO/.venv/bin/hamq" ] || { echo "no $REPO/.venv/bin/hamq" >&2; exit 1; }
exec "$PY" "$HERE/compare_peers.py" "$@"
