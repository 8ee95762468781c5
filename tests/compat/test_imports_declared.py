"""The ``is_*_available`` checks that helpers/imports.py makes with ``globals().update`` are declared for type
checkers too (its ``if TYPE_CHECKING:`` block), so ``from overdrive.helpers.imports import is_x_available``
type-checks in overdrive and in user code."""

import ast
import inspect

from overdrive.helpers import imports


def test_every_generated_check_is_declared_for_type_checkers():
    tree = ast.parse(inspect.getsource(imports))
    declared = {node.target.id for block in tree.body
                if isinstance(block, ast.If) and getattr(block.test, "id", None) == "TYPE_CHECKING"
                for node in block.body if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}
    assert declared == set(imports.PACKAGES)
    assert all(callable(getattr(imports, name)) for name in declared)
