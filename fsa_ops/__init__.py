"""fsa_ops: k2-style finite-state acceptors/transducers as JAX pytrees.

Structure-changing ops run on the host (numpy); everything that scores a lattice against network output is
jit-compiled JAX and differentiable. Names follow k2, so that ``import fsa_ops as k2`` ports most k2 code.
"""
from fsa_ops import properties as fsa_properties
from fsa_ops.connect import connect
from fsa_ops.ctc import ctc_forward_backward, ctc_nll
from fsa_ops.dense import DenseFsaVec, dense_tot_scores, intersect_dense
from fsa_ops.determinize import determinize
from fsa_ops.draw import draw, to_dot
from fsa_ops.expand import expand_ragged_attributes
from fsa_ops.fsa import Fsa, check_fsa, create_fsa_vec, to_str, to_str_simple
from fsa_ops.fsa_vec import cat, index_fsa
from fsa_ops.graph_ctc import ctc_loss
from fsa_ops.graphs import (ctc_graph, ctc_topo, levenshtein_graph, linear_fsa, linear_fsa_with_self_loops,
                            linear_fst, linear_fst_with_self_loops, trivial_graph)
from fsa_ops.intersect import compose, intersect
from fsa_ops.mwer import levenshtein_alignment, mwer_loss
from fsa_ops.nbest import Nbest, NbestShape, PathScores
from fsa_ops.online import DecodeStateInfo, OnlineDenseIntersecter
from fsa_ops.properties import get_properties, properties_to_str
from fsa_ops.prune import prune_on_arc_post
from fsa_ops.pruned import intersect_dense_pruned
from fsa_ops.ragged import Ragged
from fsa_ops.random_fsa import is_rand_equivalent, random_fsa, random_fsa_vec
from fsa_ops.random_paths import k2_path_positions, paths_to_lists, random_paths
from fsa_ops.remove_epsilon import remove_epsilon, remove_epsilon_and_add_self_loops
from fsa_ops.reverse import reverse
from fsa_ops.scores import get_arc_post, get_backward_scores, get_entering_arcs, get_forward_scores, get_tot_scores
from fsa_ops.shortest_path import shortest_path
from fsa_ops.sort import arc_sort, top_sort
from fsa_ops.symbol_table import SymbolTable
from fsa_ops.unary import add_epsilon_self_loops, closure, invert, project, remove_epsilon_self_loops, union

__all__ = [
    "Fsa", "DenseFsaVec", "create_fsa_vec", "check_fsa", "to_str", "to_str_simple", "to_dot", "draw",
    "fsa_properties", "get_properties", "properties_to_str",
    "linear_fsa", "linear_fst", "linear_fsa_with_self_loops", "linear_fst_with_self_loops", "ctc_topo", "ctc_graph",
    "levenshtein_graph", "trivial_graph",
    "arc_sort", "top_sort", "connect", "invert", "project", "add_epsilon_self_loops", "remove_epsilon_self_loops",
    "union", "closure", "remove_epsilon", "remove_epsilon_and_add_self_loops", "determinize", "intersect", "compose",
    "get_forward_scores", "get_backward_scores", "get_tot_scores", "get_arc_post", "get_entering_arcs",
    "intersect_dense", "intersect_dense_pruned", "dense_tot_scores", "shortest_path", "ctc_loss",
    "ctc_forward_backward", "ctc_nll",
    "random_fsa", "random_fsa_vec", "is_rand_equivalent",
    "SymbolTable", "reverse", "prune_on_arc_post",
    "random_paths", "k2_path_positions", "paths_to_lists", "Nbest", "NbestShape", "PathScores",
    "levenshtein_alignment", "mwer_loss",
    "OnlineDenseIntersecter", "DecodeStateInfo",
    "expand_ragged_attributes", "cat", "index_fsa", "Ragged",
]
