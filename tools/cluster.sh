#!/usr/bin/env bash
# A small real Prefect cluster on this machine, from the checkout: the pieces a multi-node deployment has,
# each a real process listening on 127.0.0.1.
#
#   bash tools/cluster.sh up        (make cluster-up)     start what is not running, deploy prefect.yaml
#   bash tools/cluster.sh status    (make cluster-status)
#   bash tools/cluster.sh down      (make cluster-down)   stop everything it started
#   eval "$(bash tools/cluster.sh env)"                   make this shell a client of the cluster
#
#   PostgreSQL   Prefect's database             127.0.0.1:$TANDEM_PG_PORT      (default 54320)
#   Prefect      API + UI                       127.0.0.1:$TANDEM_PREFECT_PORT (default 4200)
#   S3 (moto)    object store, bucket "tandem"  127.0.0.1:$TANDEM_S3_PORT      (default 9000)
#   MLflow       tracking + model registry      127.0.0.1:$TANDEM_MLFLOW_PORT  (default 5000; its database on the same
#                PostgreSQL, artifacts in s3://tandem/mlflow); the workers get MLFLOW_TRACKING_URI, so runs track to it
#   workers      one per simulated node (pool tandem-nodes, queue node-<rank>) + one for the pipeline
#                (pool tandem-pipeline); $TANDEM_NODES nodes (default 2)
#
# Bound beyond loopback (TANDEM_CLUSTER_HOST=10.0.0.5), the Prefect API, which starts code on the workers, requires
# a password: Prefect's basic auth, PREFECT_SERVER_API_AUTH_STRING on the server and PREFECT_API_AUTH_STRING on every
# client and worker. The string is yours (PREFECT_API_AUTH_STRING set when running `up`) or generated into
# .tandem/cluster/prefect-auth, readable only by its owner. Prefect's events websocket is not covered by it. MLflow
# then runs its basic-auth app: user tandem, a password generated into .tandem/cluster/mlflow-password (mode 600),
# given to the workers as MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD.
#
# State, pid files and logs live in .tandem/cluster/ ($TANDEM_CLUSTER_DIR; PostgreSQL's data survives a restart:
# `down` keeps it, `make clean` removes it). Running `up` twice starts nothing twice. On a real cluster the same pieces run on
# separate machines: see docs/docker.md ("On real machines").
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
STATE=${TANDEM_CLUSTER_DIR:-$ROOT/.tandem/cluster}
HOST=${TANDEM_CLUSTER_HOST:-127.0.0.1}
PG_PORT=${TANDEM_PG_PORT:-54320}
PREFECT_PORT=${TANDEM_PREFECT_PORT:-4200}
S3_PORT=${TANDEM_S3_PORT:-9000}
MLFLOW_PORT=${TANDEM_MLFLOW_PORT:-5000}
NODES=${TANDEM_NODES:-2}
PY=$ROOT/.venv/bin/python
BUCKET=tandem
API_URL=http://$HOST:$PREFECT_PORT/api
S3_URL=http://$HOST:$S3_PORT
MLFLOW_URL=http://$HOST:$MLFLOW_PORT

# What every Prefect process of the cluster (server, workers, the flow runs they start) sees.
export PREFECT_HOME=$STATE/prefect PREFECT_API_URL=$API_URL PREFECT_UI_API_URL=$API_URL
export PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_WORKER_QUERY_SECONDS=${PREFECT_WORKER_QUERY_SECONDS:-2}
export TANDEM_ROOT=$ROOT OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export MLFLOW_TRACKING_URI=$MLFLOW_URL  # every pipeline run of the cluster's workers tracks to its MLflow
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$ROOT/.tandem/torch_extensions}
# The local S3 endpoint for every boto/s3fs client of the cluster; moto accepts any credentials.
export AWS_ENDPOINT_URL=$S3_URL AWS_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID:-tandem} \
    AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-tandem} AWS_DEFAULT_REGION=${AWS_DEFAULT_REGION:-us-east-1}

die() { echo "cluster: $*" >&2; exit 2; }
is_loopback() { [[ $1 == 127.* || $1 == localhost || $1 == ::1 ]]; }

# The API's auth string (see the top): the user's PREFECT_API_AUTH_STRING, else off loopback one generated once into
# $AUTH_FILE (mode 600); on loopback without one, none. Exported for the server and every process started here.
AUTH_FILE=$STATE/prefect-auth
auth_setup() {
    if [[ -z ${PREFECT_API_AUTH_STRING:-} ]]; then
        is_loopback "$HOST" && return 0
        if [[ ! -s $AUTH_FILE ]]; then
            mkdir -p "$STATE"
            (umask 077; echo "tandem:$(head -c 24 /dev/urandom | base64 | tr -d '/+=')" >"$AUTH_FILE")
        fi
        chmod 600 "$AUTH_FILE"
        PREFECT_API_AUTH_STRING=$(cat "$AUTH_FILE")
    fi
    export PREFECT_API_AUTH_STRING PREFECT_SERVER_API_AUTH_STRING=$PREFECT_API_AUTH_STRING
}

# How a client shell gets the auth string, without printing it.
auth_hint() {
    if [[ -z ${PREFECT_API_AUTH_STRING:-} ]]; then return 0; fi
    if [[ -s $AUTH_FILE && $(cat "$AUTH_FILE") == "$PREFECT_API_AUTH_STRING" ]]; then
        echo "export PREFECT_API_AUTH_STRING=\"\$(cat $AUTH_FILE)\""
    else
        echo "export PREFECT_API_AUTH_STRING=...   # the string you gave when starting the cluster"
    fi
}
alive() { [[ -f $STATE/$1.pid ]] && kill -0 "$(cat "$STATE/$1.pid")" 2>/dev/null; }

# Start "$@" in its own process group (set -m), immune to the shell's hangup, logging to $STATE/$name.log.
spawn() {
    local name=$1; shift
    if alive "$name"; then echo "cluster: $name already running (pid $(cat "$STATE/$name.pid"))"; return; fi
    set -m
    nohup "$@" >>"$STATE/$name.log" 2>&1 &
    echo $! >"$STATE/$name.pid"
    set +m
    echo "cluster: $name started (pid $!, log .tandem/cluster/$name.log)"
}

# SIGTERM the process group, SIGKILL it after 20 s.
stop() {
    local name=$1 pid
    [[ -f $STATE/$name.pid ]] || return 0
    pid=$(cat "$STATE/$name.pid")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM -- "-$pid" 2>/dev/null || true
        for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -KILL -- "-$pid" 2>/dev/null || true
        echo "cluster: $name stopped"
    fi
    rm -f "$STATE/$name.pid"
}

wait_for() {  # wait_for NAME URL: until URL answers (or NAME died)
    for _ in $(seq 180); do
        curl -sf -o /dev/null "$2" && return 0
        alive "$1" || die "$1 exited; see .tandem/cluster/$1.log"
        sleep 1
    done
    die "$1 did not answer at $2 within 180 s; see .tandem/cluster/$1.log"
}

# ---- PostgreSQL: a private instance (its own data dir and port), run as the postgres user when we are root.
pg_bin() {
    local dir
    # Debian keeps initdb/pg_ctl out of PATH (/usr/lib/postgresql/N/bin); a PATH entry may be a symlink to there.
    dir=$(dirname "$(readlink -f "$(command -v initdb 2>/dev/null || ls -d /usr/lib/postgresql/*/bin/initdb 2>/dev/null \
        | sort -V | tail -n1)")")
    [[ -x $dir/initdb ]] || return 1
    echo "$dir"
}

as_pg() { if [[ $(id -u) == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }

postgres_up() {
    local bin data=$STATE/pgdata
    if ! bin=$(pg_bin); then
        if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
            echo "cluster: installing PostgreSQL (apt-get install postgresql)"
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
            bin=$(pg_bin) || die "PostgreSQL installed but initdb not found"
        else
            die "PostgreSQL not found: install it (Debian/Ubuntu: sudo apt-get install postgresql), then rerun"
        fi
    fi
    [[ -f $STATE/pg-password ]] || { head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$STATE/pg-password"; }
    chmod 600 "$STATE/pg-password"
    mkdir -p "$data" "$STATE/pgsocket"
    # initdb refuses to run as root: the data directory, socket and password file belong to postgres.
    [[ $(id -u) == 0 ]] && chown postgres "$data" "$STATE/pgsocket" "$STATE/pg-password"
    if [[ ! -f $data/PG_VERSION ]]; then
        as_pg "$bin/initdb" -D "$data" -U prefect --pwfile="$STATE/pg-password" --auth-local=trust \
            --auth-host=scram-sha-256 -E UTF8 >"$STATE/postgres-init.log" 2>&1 \
            || die "initdb failed; see .tandem/cluster/postgres-init.log"
    fi
    # initdb lets TCP clients in from loopback only; bound beyond it, the server connects from $HOST (this machine).
    local hba="host all prefect $HOST/32 scram-sha-256"
    if ! is_loopback "$HOST" && ! grep -qxF "$hba" "$data/pg_hba.conf"; then
        echo "$hba" >>"$data/pg_hba.conf"
        as_pg "$bin/pg_ctl" -D "$data" status >/dev/null 2>&1 && as_pg "$bin/pg_ctl" -D "$data" reload >/dev/null
    fi
    if as_pg "$bin/pg_ctl" -D "$data" status >/dev/null 2>&1; then
        echo "cluster: postgres already running"
    else
        touch "$STATE/postgres.log"; [[ $(id -u) == 0 ]] && chown postgres "$STATE/postgres.log"
        as_pg "$bin/pg_ctl" -D "$data" -l "$STATE/postgres.log" -w -t 60 start \
            -o "-c listen_addresses=$HOST -p $PG_PORT -c unix_socket_directories=$STATE/pgsocket" >/dev/null \
            || die "PostgreSQL did not start; see .tandem/cluster/postgres.log"
        echo "cluster: postgres started ($HOST:$PG_PORT)"
    fi
    local db
    for db in prefect mlflow; do
        as_pg "$bin/psql" -h "$STATE/pgsocket" -p "$PG_PORT" -U prefect -d postgres -tAc \
            "SELECT 1 FROM pg_database WHERE datname = '$db'" | grep -q 1 \
            || as_pg "$bin/createdb" -h "$STATE/pgsocket" -p "$PG_PORT" -U prefect "$db"
    done
}

postgres_down() {
    local bin
    bin=$(pg_bin) || return 0
    [[ -f $STATE/pgdata/PG_VERSION ]] || return 0
    if as_pg "$bin/pg_ctl" -D "$STATE/pgdata" status >/dev/null 2>&1; then
        as_pg "$bin/pg_ctl" -D "$STATE/pgdata" -m fast -w stop >/dev/null && echo "cluster: postgres stopped"
    fi
}

# ---- the rest
s3_up() {
    spawn s3 "$ROOT/.venv/bin/moto_server" -H "$HOST" -p "$S3_PORT"
    wait_for s3 "$S3_URL/"
    "$PY" -c "import boto3, sys
s3 = boto3.client('s3')
if '$BUCKET' not in [b['Name'] for b in s3.list_buckets()['Buckets']]:
    s3.create_bucket(Bucket='$BUCKET')"
}

prefect_up() {
    PREFECT_API_DATABASE_CONNECTION_URL="postgresql+asyncpg://prefect:$(cat "$STATE/pg-password")@$HOST:$PG_PORT/prefect" \
        spawn server "$PY" -m prefect server start --host "$HOST" --port "$PREFECT_PORT"
    wait_for server "$API_URL/health"
}

# MLflow's basic auth off loopback (see the top): its admin user, the password generated once, a config file for the
# server (MLFLOW_AUTH_CONFIG_PATH; users in SQLite beside it). Exported for the server and every process started here.
MLFLOW_PASSWORD_FILE=$STATE/mlflow-password
mlflow_auth_setup() {
    is_loopback "$HOST" && return 0
    if [[ ! -s $MLFLOW_PASSWORD_FILE ]]; then
        mkdir -p "$STATE"
        (umask 077; head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$MLFLOW_PASSWORD_FILE")
    fi
    chmod 600 "$MLFLOW_PASSWORD_FILE"
    export MLFLOW_TRACKING_USERNAME=tandem MLFLOW_TRACKING_PASSWORD
    MLFLOW_TRACKING_PASSWORD=$(cat "$MLFLOW_PASSWORD_FILE")
    (umask 077; cat >"$STATE/mlflow-auth.ini" <<INI
[mlflow]
default_permission = READ
database_uri = sqlite:///$STATE/mlflow-auth.db
admin_username = $MLFLOW_TRACKING_USERNAME
admin_password = $MLFLOW_TRACKING_PASSWORD
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
INI
    )
}

mlflow_up() {
    local args=(--host "$HOST" --port "$MLFLOW_PORT" --workers 1
        --backend-store-uri "postgresql://prefect:$(cat "$STATE/pg-password")@$HOST:$PG_PORT/mlflow"
        --artifacts-destination "s3://$BUCKET/mlflow")
    # MLflow reads MLFLOW_AUTH_CONFIG_PATH even without its auth app (search_runs filters by permission whenever
    # Flask-WTF is installed): pointing it at no file answers every run search with a 500, so only off loopback.
    local auth_env=()
    if ! is_loopback "$HOST"; then
        auth_env=(MLFLOW_AUTH_CONFIG_PATH="$STATE/mlflow-auth.ini")
        # MLflow answers only the Host names it is told (DNS rebinding protection), loopback by default.
        args+=(--app-name basic-auth --allowed-hosts "$HOST:$MLFLOW_PORT,$HOST,localhost:$MLFLOW_PORT,127.0.0.1:$MLFLOW_PORT")
        # The basic-auth app's CSRF protection signs with this key; new at every start of the server.
        export MLFLOW_FLASK_SERVER_SECRET_KEY
        MLFLOW_FLASK_SERVER_SECRET_KEY=$(head -c 32 /dev/urandom | base64 | tr -d '/+=')
    fi
    # MLFLOW_SERVER_ENABLE_JOB_EXECUTION: without MLflow's job runner (GenAI scoring, a dozen processes Tandem never uses).
    spawn mlflow env "${auth_env[@]}" MLFLOW_S3_ENDPOINT_URL="$S3_URL" MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false \
        "$ROOT/.venv/bin/mlflow" server "${args[@]}"
    wait_for mlflow "$MLFLOW_URL/health"
}

workers_up() {
    local rank
    "$PY" tools/deploy.py --nodes "$NODES" >"$STATE/deploy.log" 2>&1 || die "deploy failed; see .tandem/cluster/deploy.log"
    echo "cluster: prefect.yaml deployed (finetune/nightly, finetune/manual, node/node)"
    for rank in $(seq 0 $((NODES - 1))); do
        spawn "worker-node-$rank" "$PY" -m prefect worker start --pool tandem-nodes --work-queue "node-$rank" \
            --name "node-$rank"
    done
    spawn worker-pipeline "$PY" -m prefect worker start --pool tandem-pipeline --name pipeline
}

usage() {
    cat <<EOF

Prefect UI     http://$HOST:$PREFECT_PORT  (Deployments > finetune/manual > Run > Custom run: the config form)
API            export PREFECT_API_URL=$API_URL
$(if [[ -n ${PREFECT_API_AUTH_STRING:-} ]]; then echo "API auth       $(auth_hint)   (user:password for the UI)"; fi)
MLflow UI      $MLFLOW_URL  (experiment tandem; registered models mirror the registry)
               export MLFLOW_TRACKING_URI=$MLFLOW_URL
$(if ! is_loopback "$HOST"; then echo "MLflow auth    export MLFLOW_TRACKING_USERNAME=tandem MLFLOW_TRACKING_PASSWORD=\"\$(cat $MLFLOW_PASSWORD_FILE)\""; fi)
S3 endpoint    export AWS_ENDPOINT_URL=$S3_URL AWS_ACCESS_KEY_ID=tandem AWS_SECRET_ACCESS_KEY=tandem AWS_DEFAULT_REGION=us-east-1
               bucket s3://$BUCKET
Run the pipeline through finetune/manual, storing on the S3 endpoint and training through the node workers:
  PREFECT_API_URL=$API_URL .venv/bin/python -m flows.submit finetune/manual --config tiny-cpu --wait \\
      --set run.storage=s3://$BUCKET/tandem --set launch.backend=prefect
Stop everything: make cluster-down
EOF
}

status() {
    local name
    for name in server s3 mlflow worker-pipeline $(cd "$STATE" 2>/dev/null && ls worker-node-*.pid 2>/dev/null | sed 's/\.pid$//'); do
        if alive "$name"; then echo "$name: running (pid $(cat "$STATE/$name.pid"))"; else echo "$name: stopped"; fi
    done
    local bin
    if bin=$(pg_bin) && [[ -f $STATE/pgdata/PG_VERSION ]] && as_pg "$bin/pg_ctl" -D "$STATE/pgdata" status >/dev/null 2>&1; then
        echo "postgres: running ($HOST:$PG_PORT)"
    else
        echo "postgres: stopped"
    fi
}

case ${1:-} in
    up)
        [[ -x $PY ]] || die ".venv missing: run make setup first"
        [[ $NODES =~ ^[1-9][0-9]*$ ]] || die "TANDEM_NODES must be a positive integer, got '$NODES'"
        mkdir -p "$STATE"
        auth_setup
        mlflow_auth_setup
        is_loopback "$HOST" || echo "cluster: bound to $HOST: the Prefect API and MLflow require their passwords;" \
            "the S3 endpoint (moto) accepts any credentials, so keep $HOST on a trusted network"
        postgres_up
        s3_up
        prefect_up
        mlflow_up
        workers_up
        usage
        ;;
    down)
        for pidfile in "$STATE"/worker-*.pid; do [[ -e $pidfile ]] && stop "$(basename "$pidfile" .pid)"; done
        stop server
        stop mlflow
        stop s3
        postgres_down
        ;;
    status) status ;;
    env)
        auth_setup
        echo "export PREFECT_API_URL=$API_URL MLFLOW_TRACKING_URI=$MLFLOW_URL"
        auth_hint
        is_loopback "$HOST" || echo "export MLFLOW_TRACKING_USERNAME=tandem MLFLOW_TRACKING_PASSWORD=\"\$(cat $MLFLOW_PASSWORD_FILE)\""
        ;;
    *) die "usage: bash tools/cluster.sh up|down|status|env" ;;
esac
