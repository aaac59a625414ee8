#!/usr/bin/env bash
# Entry point of the training image. One container per node:
#   worker QUEUE [POOL]   a Prefect process worker serving QUEUE (node-0, node-1, ... or default) of POOL
#                         (default tandem-nodes): the `prefect` launch backend sends node r's run to node-r
#   node [ARGS]           python -m launch.node ARGS, with NNODES/NODE_RANK/MASTER_ADDR/MASTER_PORT from the
#                         environment (by hand or from another scheduler)
#   anything else         run as given (python -m flows.finetune ..., bash, ...)
set -euo pipefail
case "${1:---help}" in
    worker)
        queue=${2:?usage: worker QUEUE [POOL]}
        exec prefect worker start --pool "${3:-tandem-nodes}" --work-queue "$queue" ;;
    node)
        shift
        exec python -m launch.node "$@" ;;
    --help|-h|help)
        sed -n '2,8p' "$0" ;;
    *)
        exec "$@" ;;
esac
