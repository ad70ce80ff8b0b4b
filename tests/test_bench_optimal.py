"""bench.bench_optimal's programs: the heuristics against the optimum, planned."""

import jax

from bench.bench_optimal import PROGRAMS
from remat._jax.call import CallSpec
from remat._jax.program import trace_program
from remat.core.algorithms import get_algorithm
from remat.core.options import RematOptions
from remat.core.scheduled import on_schedule
from remat.core.schedulers import get_scheduler


def test_standard_steps_back_from_an_exchange_that_leads_nowhere():
    # The U-Net at 30% of its predicted temporaries: after the dearest conv is
    # banned, the first of six equally dear convs whose ban pays (36.3 MFLOP)
    # leads where no ban pays; banning another of them instead reaches 28.6,
    # within 1.3x the optimum's 22.3 (1.62x before exchanges stepped back).
    model = PROGRAMS["unet (3 levels, 32x32, 8 ch)"]()
    program, _ = trace_program(jax.grad(model.loss_fn), (model.params, model.batch),
                               {}, CallSpec(), {})
    scheduled = on_schedule(program.graph, get_scheduler("best")(program.graph))
    base = scheduled.timeline
    fixed = base.input_bytes + base.output_bytes
    limit = fixed + int(0.3 * (base.peak_bytes - fixed))
    plans = {name: get_algorithm(name)(scheduled, RematOptions(limit, name,
                                                               small_node_bytes=0))
             for name in ("standard", "optimal")}
    assert all(p.met for p in plans.values())
    assert plans["standard"].extra_flops <= 1.3 * plans["optimal"].extra_flops
