#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the tests (never the distribution's default cluster).
#
#   eval "$(bash .ci/postgres.sh start)"   # prints: export CROSSFLOW_TEST_POSTGRES=postgresql://crossflow@127.0.0.1:PORT/postgres
#                                         #         export CROSSFLOW_TEST_POSTGRES_DIR=/tmp/crossflow-pg.XXXXXX
#   bash .ci/postgres.sh stop [DIR]       # DIR defaults to $CROSSFLOW_TEST_POSTGRES_DIR
#
# `start` makes a fresh cluster in a new temporary folder (initdb, trust authentication for
# the Unix socket in that folder and 127.0.0.1 only, superuser role `crossflow`), starts it
# listening on 127.0.0.1 only, on the first free port from 54329 on, and waits until it
# accepts connections.  Only the export lines go to stdout; progress and errors go to stderr.
# initdb and the server refuse to run as root: as root they run as the `postgres` system user
# (created by Debian's postgresql package) via runuser, otherwise as the current user.
# `stop` stops that server and deletes the folder.
set -euo pipefail

MARKER=.crossflow-throwaway-postgres
FIRST_PORT=${CROSSFLOW_PG_FIRST_PORT:-54329}

die() { echo "postgres.sh: $*" >&2; exit 1; }

find_bindir() {
    local d
    d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
    if [[ -n "$d" && -x "$d/initdb" && -x "$d/pg_ctl" ]]; then
        echo "$d"
        return
    fi
    d=$(command -v pg_ctl 2>/dev/null || true)  # other systems: binaries on PATH
    if [[ -n "$d" && -x "$(dirname "$d")/initdb" ]]; then
        dirname "$d"
        return
    fi
    die "no PostgreSQL server binaries (initdb, pg_ctl) in /usr/lib/postgresql/*/bin or on" \
        "PATH; install them, e.g. apt-get install postgresql"
}

# as_owner CMD...: run CMD as the cluster's owner (postgres when we are root), in $ROOT
as_owner() {
    if [[ $(id -u) -eq 0 ]]; then
        (cd "$ROOT" && runuser -u postgres -- "$@")
    else
        (cd "$ROOT" && "$@")
    fi
}

port_in_use() {  # something accepts TCP connections on 127.0.0.1:$1
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

start() {
    local bindir port url started=""
    bindir=$(find_bindir)
    if [[ $(id -u) -eq 0 ]] && ! id -u postgres >/dev/null 2>&1; then
        die "running as root but there is no 'postgres' system user to run the server as"
    fi
    ROOT=$(mktemp -d "${TMPDIR:-/tmp}/crossflow-pg.XXXXXX")
    touch "$ROOT/$MARKER"
    if [[ $(id -u) -eq 0 ]]; then
        chown -R postgres: "$ROOT"
    fi
    echo "postgres.sh: initdb ($bindir) in $ROOT/data" >&2
    if ! as_owner "$bindir/initdb" -D "$ROOT/data" -U crossflow -E UTF8 --locale=C \
            --auth-local=trust --auth-host=trust >"$ROOT/initdb.log" 2>&1; then
        cat "$ROOT/initdb.log" >&2
        rm -rf "$ROOT"
        die "initdb failed"
    fi
    # trust for the Unix socket and 127.0.0.1 only (initdb's default also lists ::1 and
    # replication)
    printf '%s\n' "# throwaway test cluster (.ci/postgres.sh)" \
        "local all all trust" \
        "host  all all 127.0.0.1/32 trust" | as_owner tee "$ROOT/data/pg_hba.conf" >/dev/null
    for ((port = FIRST_PORT; port < FIRST_PORT + 200; port++)); do
        port_in_use "$port" && continue
        # fsync etc. off: the data is thrown away; max_connections for ~6 test workers with
        # a small pool each, plus MLflow servers
        if as_owner "$bindir/pg_ctl" -D "$ROOT/data" -l "$ROOT/server.log" -w -t 60 \
                -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$ROOT -c max_connections=200 -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
                start >&2; then
            started=1
            break
        fi
        echo "postgres.sh: could not start on port $port, trying the next one" >&2
    done
    if [[ -z "$started" ]]; then
        tail -n 20 "$ROOT/server.log" >&2 || true
        rm -rf "$ROOT"
        die "the server did not start on any port from $FIRST_PORT"
    fi
    local ready=""
    for _ in $(seq 1 60); do
        if "$bindir/pg_isready" -q -h 127.0.0.1 -p "$port" -U crossflow -d postgres; then
            ready=1
            break
        fi
        sleep 0.5
    done
    if [[ -z "$ready" ]]; then
        tail -n 20 "$ROOT/server.log" >&2 || true
        as_owner "$bindir/pg_ctl" -D "$ROOT/data" -m immediate stop >&2 || true
        rm -rf "$ROOT"
        die "the server on port $port is not ready after 30 s"
    fi
    echo "$bindir" >"$ROOT/bindir"
    url="postgresql://crossflow@127.0.0.1:$port/postgres"
    echo "postgres.sh: PostgreSQL $("$bindir/pg_ctl" --version | sed "s/^pg_ctl (PostgreSQL) //") ready at $url (stop: bash .ci/postgres.sh stop $ROOT)" >&2
    printf 'export CROSSFLOW_TEST_POSTGRES=%q\n' "$url"
    printf 'export CROSSFLOW_TEST_POSTGRES_DIR=%q\n' "$ROOT"
}

stop() {
    ROOT=${1:-${CROSSFLOW_TEST_POSTGRES_DIR:-}}
    [[ -n "$ROOT" ]] || die "usage: postgres.sh stop DIR (or set CROSSFLOW_TEST_POSTGRES_DIR)"
    [[ -d "$ROOT" ]] || { echo "postgres.sh: $ROOT does not exist (already stopped?)" >&2; return 0; }
    [[ -f "$ROOT/$MARKER" ]] || die "$ROOT is not a cluster made by postgres.sh start; not touching it"
    local bindir
    bindir=$(cat "$ROOT/bindir" 2>/dev/null || find_bindir)
    if [[ -f "$ROOT/data/postmaster.pid" ]]; then
        as_owner "$bindir/pg_ctl" -D "$ROOT/data" -m fast -w -t 30 stop >&2 \
            || as_owner "$bindir/pg_ctl" -D "$ROOT/data" -m immediate stop >&2 || true
    fi
    rm -rf "$ROOT"
    echo "postgres.sh: stopped and removed $ROOT" >&2
}

case "${1:-}" in
    start) start ;;
    stop) stop "${2:-}" ;;
    *) die "usage: postgres.sh start | stop [DIR]" ;;
esac
