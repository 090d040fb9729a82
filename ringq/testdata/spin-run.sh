#!/bin/bash
# Interleaved rounds: base binary (current code) and the variant binary under four policies.
out=/work/main/ringq/testdata
cd /tmp
run() { # name env...
  name=$1; shift
  env "$@" /tmp/ringq-spin-$bin.test -test.run '^$' -test.bench "$pat" -test.benchmem -test.count 1 >> $out/spin-$kind-$name.txt
}
rounds() { # label: 6 rounds of every policy
  for i in 1 2 3 4 5 6; do
    echo "$1round $i $(date -u +%T) $(uptime)" >> $out/spin-load.txt
    bin=base run base
    bin=var run spin1us RINGQ_SPIN_NS=1000
    bin=var run spin3us RINGQ_SPIN_NS=3000
    bin=var run spin10us RINGQ_SPIN_NS=10000
    bin=var run adaptive RINGQ_SPIN_NS=10000 RINGQ_ADAPT=1 RINGQ_SPIN_SHORT_NS=1000
  done
}
kind=bench pat='(SPSC|FanIn2|FanOut2)/batch=(1|64)/q=(chan|ring)' rounds ""
kind=idle pat='Idle' rounds "idle "
echo "done $(date -u +%T) $(uptime)" >> $out/spin-load.txt
