from remat.core.dot import to_dot
from remat.core.memlog import format_bytes, memlog
from remat.core.plot import plot_timeline
from remat.core.simulate import simulate

from .random_graphs import chain, random_dag


def test_memlog_has_one_line_per_op_and_marks_the_peak():
    g = random_dag(3, num_ops=20)
    tl = simulate(g, g.topological_order)
    text = memlog(g, tl, decisions={g.topological_order[0]: "recompute"}, raw_bytes=True)
    lines = text.splitlines()
    assert lines[0].split() == ["step", "op", "label", "source", "defined", "freed",
                                "live", "remat"]
    assert len(lines) == 1 + len(g.ops)
    assert lines[1 + tl.peak_step].startswith("*")
    assert lines[1].rstrip().endswith("recompute")
    assert str(tl.peak_bytes) in lines[1 + tl.peak_step]


def test_format_bytes():
    assert format_bytes(12) == "12 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(3 * 1024**2) == "3.0 MiB"


def test_dot_marks_peak_and_recomputed_ops():
    g = chain(4)
    tl = simulate(g, g.topological_order)
    text = to_dot(g, tl, recomputed={1})
    assert text.startswith("digraph remat {") and text.endswith("}")
    assert "op1 [" in text and "fillcolor=orange" in text
    peak_op = tl.schedule[tl.peak_step]
    assert any(line.strip().startswith(f"op{peak_op} [") and "color=red" in line
               for line in text.splitlines())


def test_plot_writes_a_png(tmp_path):
    g = chain(10)
    path = tmp_path / "timeline.png"
    plot_timeline(g, simulate(g, g.topological_order), path, limit_bytes=300,
                  recomputed={2})
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
