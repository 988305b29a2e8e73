#!/bin/bash
# N processes at once; all start their timed rounds together. Usage: run_crowd.sh N TAG
PIN=([1]="${PIN1}" [2]="${PIN2}" [3]="${PIN3}")
N=$1; TAG=$2; D=/tmp/cl/probe/$TAG; rm -rf $D; mkdir -p $D
HERE=$(cd "$(dirname "$0")" && pwd)
for i in $(seq 1 $N); do ${PIN[$i]} "$HERE/../../.venv/bin/python" "$HERE/balancer_crowd.py" $D/ready$i $D/go > $D/out$i.log 2>$D/err$i.log & done
while [ $(ls $D/ready* 2>/dev/null | wc -l) -lt $N ]; do sleep 0.5; done
touch $D/go; wait
for i in $(seq 1 $N); do grep round $D/out$i.log | tr '\n' ' '; echo; done
