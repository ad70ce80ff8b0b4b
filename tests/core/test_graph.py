import pytest

from remat.core.graph import Graph, GraphBuilder, GraphError, Op, Value

from .random_graphs import random_dag


def test_builder_records_producers_users_and_neighbours():
    b = GraphBuilder()
    x = b.add_input(8, name="x")
    (y,) = b.add_op("a", [x, x], [8])
    (z,) = b.add_op("b", [x, y], [8])
    g = b.build(outputs=[z])
    assert g.values[y].producer == 0 and g.values[x].producer is None
    assert g.users[x] == (0, 1)
    assert g.op_predecessors(1) == (0,)
    assert g.op_successors(0) == (1,)
    assert g.topological_order == (0, 1)


def test_topological_order_respects_every_edge():
    for seed in range(20):
        g = random_dag(seed, num_ops=40)
        position = {op: i for i, op in enumerate(g.topological_order)}
        assert sorted(position) == list(range(len(g.ops)))
        for op_id in range(len(g.ops)):
            for pred in g.op_predecessors(op_id):
                assert position[pred] < position[op_id]


def test_cycle_is_rejected_with_a_clear_message():
    values = (Value(4, 1), Value(4, 0))
    ops = (Op("a", (0,), (1,)), Op("b", (1,), (0,)))
    with pytest.raises(GraphError, match="cycle"):
        Graph(values, ops, (), (0,))


def test_inconsistent_producer_is_rejected():
    with pytest.raises(GraphError, match="producer"):
        Graph((Value(4, None), Value(4, None)), (Op("a", (0,), (1,)),), (0,), (1,))


def test_unknown_value_and_bad_fusion_kind_are_rejected():
    b = GraphBuilder()
    with pytest.raises(GraphError, match="does not exist"):
        b.add_op("a", [3], [4])
    x = b.add_input(4)
    b.add_op("a", [x], [4], fusion="elementwise")
    with pytest.raises(GraphError, match="fusion kind"):
        b.build(outputs=[])


def test_donated_must_be_an_input():
    with pytest.raises(GraphError, match="donated"):
        Graph((Value(4, None), Value(4, 0)), (Op("a", (0,), (1,)),), (0,), (1,),
              frozenset({1}))


def test_a_rewired_graph_has_the_derived_fields_of_the_graph_built_whole():
    import pickle
    b = GraphBuilder()
    x = b.add_input(8)
    (y,) = b.add_op("a", [x], [8])
    (z,) = b.add_op("b", [y], [8], fusion="loop")
    g = b.build(outputs=[z])
    # a copy of op 0 (value 3) that op 1 reads instead of value 1
    values = g.values + (Value(8, 2),)
    ops = (g.ops[0], g.ops[1]._replace(inputs=(3,)), Op("a", (x,), (3,)))
    r = Graph.rewired(g, values, ops, changed=[1, 2], order=(0, 2, 1))
    assert r.users == ((0, 2), (), (), (1,))
    assert r.predecessors == ((), (2,), ()) and r.successors == ((), (), (1,))
    assert r.topological_order == (0, 2, 1)
    whole = Graph(values, ops, g.inputs, g.outputs, g.donated)
    for field in ("users", "predecessors", "successors", "fusion"):
        assert getattr(r, field) == getattr(whole, field), field
    again = pickle.loads(pickle.dumps(r))
    assert again.successors == r.successors and again.fusion == r.fusion


def test_a_graph_cannot_be_changed():
    import dataclasses
    g = random_dag(0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.users = ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.anything = 1
