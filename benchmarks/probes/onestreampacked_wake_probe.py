"""The AMX kernel rebuilt under its own targets with counters around `spread`: per call, the delay
before a pool helper takes its first item, and the share of items the calling thread ran; one-row
products of onestreampacked_ab2.py (q/k/v separate), 30 repetitions. Prints at exit."""
import logging, time, statistics as st, sys
import jax, jax.numpy as jnp, numpy as np
from jaxinfer.kernels.cpu import amx as a
from jaxinfer.kernels.cpu import build as native_build
assert a.available()
src = open(a.SOURCE).read()
inst = r'''
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
static std::atomic<long> g_calls{0}, g_delay_ns{0}, g_helped{0}, g_caller_items{0}, g_items{0};
struct Dump { ~Dump() { fprintf(stderr, "calls %ld helped %ld mean wake delay us %.1f caller share %.2f\n", g_calls.load(), g_helped.load(), g_delay_ns.load() / 1e3 / (g_helped.load() ? g_helped.load() : 1), double(g_caller_items.load()) / g_items.load()); } } g_dump;
'''
src = src.replace('namespace ffi = xla::ffi;', inst + 'namespace ffi = xla::ffi;', 1)
src = src.replace('''  jaxinfer::parallel_items(pool, items, [item, per_item, pairs](int64_t i) {
    item(i * per_item, std::min(pairs, (i + 1) * per_item));''', '''  const auto me = std::this_thread::get_id(); g_calls++;
  const auto t0 = std::chrono::steady_clock::now();
  auto first = std::make_shared<std::atomic<bool>>(false);
  g_items += items;
  jaxinfer::parallel_items(pool, items, [item, per_item, pairs, me, t0, first](int64_t i) {
    if (std::this_thread::get_id() == me) g_caller_items++;
    else if (!first->exchange(true)) { g_helped++; g_delay_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count(); }
    item(i * per_item, std::min(pairs, (i + 1) * per_item));''')
path = a.SOURCE.parent / "_probe_wake.cc"; path.write_text(src)
try:
    why = native_build.register(path, "wake", "JAXINFER_NATIVE_AMX", {"amx_wake": "JaxinferAmxGemm", "amx_wake_g": "JaxinferAmxGated"}, logging.getLogger("p"))
finally:
    path.unlink()
assert why is None, why
a.TARGET = "amx_wake"; a.GATED_TARGET = "amx_wake_g"
exec(open(__file__.rsplit('/', 1)[0] + '/onestreampacked_ab2.py').read().split("sep = jax.jit")[0])
f = jax.jit(lambda x: body(x, False))
x = jnp.ones((1,576), jnp.float32)*0.1
for i in range(30): f(x).block_until_ready()
