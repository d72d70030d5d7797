"""The modules of gather, reduce, all-to-all, scan, uneven blocks and point-to-point calls see
only the transport seam, as test_structure.py asks of every algorithm."""

from __future__ import annotations

import pytest

from test_structure import test_an_algorithm_sees_only_the_transport_seam as sees_only_the_seam


@pytest.mark.parametrize("name", ["gather", "reduce", "all_to_all", "scan", "blocks",
                                  "point_to_point", "check"])
def test_a_new_algorithm_sees_only_the_transport_seam(name):
    sees_only_the_seam(name)
