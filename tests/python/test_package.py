"""What the package ships: every public name, the type stubs, the py.typed marker."""

import os

import kvpage

PACKAGE = os.path.dirname(kvpage.__file__)


def test_public_names_resolve():
    for name in kvpage.__all__:
        assert getattr(kvpage, name) is not None, name


def test_type_stubs_ship_with_the_module():
    with open(os.path.join(os.path.dirname(kvpage._kvpage.__file__), "_kvpage.pyi")) as f:
        stub = f.read()
    for declaration in ("class Scheduler:", "class StepOutput:", "def load_model(",
                        "def update(", "def schedule(self) -> StepOutput", "def cache(",
                        "def to_torch(self) -> dict", "def close(self) -> None"):
        assert declaration in stub, declaration
    assert os.path.exists(os.path.join(PACKAGE, "py.typed"))


def test_bundled_traces_ship_with_the_package():
    # Next to the compiled module, where simulate() looks (under `pip install -e .` the .py
    # files stay in the source tree).
    module_dir = os.path.dirname(kvpage._kvpage.__file__)
    assert os.path.exists(os.path.join(module_dir, "data", "traces",
                                       "mooncake_conversation_trace.jsonl"))
