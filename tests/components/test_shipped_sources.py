"""Every lightweight component runs as its own source file (the function, its `additional_funcs`,
nothing else of its module): a module-level name it uses would be a NameError on Vertex and in
kfp.local, found only when that step runs. Checked here for every component, from the compiled
programs themselves."""

from __future__ import annotations

import builtins
import dis
import types
from typing import Any

import pytest

from components import evaluation, image, plan, prepare, registry, tuning, worker_pools
from local import steps

MODULES = (evaluation, image, plan, prepare, registry, tuning, worker_pools, steps)


def components() -> list[tuple[str, Any]]:
    found = []
    for module in MODULES:
        for name, value in vars(module).items():
            func = getattr(value, "python_func", None)
            if (
                getattr(value, "component_spec", None) is not None
                and func
                and func.__module__ == module.__name__
            ):
                found.append((f"{module.__name__}.{name}", value))
    return found


def program(component: Any) -> str:
    spec = component.pipeline_spec
    [executor] = spec.deployment_spec["executors"].values()
    return str(executor["container"]["command"][-1])


def globals_used(code: types.CodeType) -> set[str]:
    names = {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= globals_used(const)
    return names


def test_there_are_components_to_check() -> None:
    names = {n for n, _ in components()}
    assert {"components.plan.plan_jobs", "components.evaluation.evaluate_model"} <= names
    assert {"components.registry.upload_settings", "local.steps.local_upload_model"} <= names
    assert len(names) >= 12


@pytest.mark.parametrize(("name", "component"), components(), ids=[n for n, _ in components()])
def test_shipped_source_defines_every_name_it_uses(name: str, component: Any) -> None:
    source = program(component)
    namespace: dict[str, Any] = {"__name__": "shipped"}
    exec(compile(source, f"{name}.py", "exec"), namespace)
    used = globals_used(compile(source, f"{name}.py", "exec"))
    missing = sorted(n for n in used if n not in namespace and not hasattr(builtins, n))
    assert not missing, f"{name} uses names its shipped source does not define: {missing}"
