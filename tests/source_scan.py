"""Reading the package's source for the structure guards (tests/test_no_family_names.py,
tests/drafts/test_dspark_is_one_folder.py): which lines are docstrings, so prose may name what code may not."""

import ast


def docstring_lines(tree: ast.AST) -> set[int]:
    """Every line number a module, class or function docstring of ``tree`` spans."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines
