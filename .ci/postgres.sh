#!/usr/bin/env bash
# A throwaway PostgreSQL server on loopback for the storage tests.
#   .ci/postgres.sh start   -> prints "URL DATADIR" (installs Debian's postgresql if missing)
#   .ci/postgres.sh stop DATADIR
# As root, the server runs as the 'postgres' user (initdb refuses root).
set -euo pipefail
find_bin() {
    local b
    b=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
    if [[ -z "$b" ]] && command -v initdb >/dev/null; then b=$(dirname "$(command -v initdb)"); fi
    echo "$b"
}
as_owner() {
    if [[ $(id -u) == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}
case "${1:-}" in
start)
    BIN=$(find_bin)
    if [[ -z "$BIN" ]]; then
        (apt-get install -y -q postgresql || (apt-get update -q && apt-get install -y -q postgresql)) >&2
        BIN=$(find_bin)
    fi
    [[ -n "$BIN" ]] || { echo "postgres.sh: no PostgreSQL binaries" >&2; exit 1; }
    PORT=${PGPORT_TEST:-$(python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")}
    DIR=$(mktemp -d /tmp/autotune-pg.XXXXXX)
    chmod 755 "$DIR"
    [[ $(id -u) == 0 ]] && chown postgres "$DIR"
    as_owner "$BIN/initdb" -D "$DIR/data" -A trust -U autotune >"$DIR/initdb.log" 2>&1
    as_owner "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w \
        -o "-p $PORT -k $DIR -c listen_addresses=127.0.0.1" start >&2
    as_owner "$BIN/createdb" -h 127.0.0.1 -p "$PORT" -U autotune autotune
    echo "postgresql://autotune@127.0.0.1:$PORT/autotune $DIR/data"
    ;;
stop)
    BIN=$(find_bin)
    as_owner "$BIN/pg_ctl" -D "$2" -m fast stop >&2 || true
    rm -rf "$(dirname "$2")"
    ;;
*)
    echo "usage: $0 start | stop DATADIR" >&2
    exit 2
    ;;
esac
