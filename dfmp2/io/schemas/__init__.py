"""The published JSON Schemas (draft 2020-12) of the documents dfmp2 writes, shipped in the package.

    result.schema.json       dfmp2 run --json (dfmp2.io.result.Result.to_dict)
    gradient.schema.json     dfmp2 gradient --json, and dfmp2 run of a QCSchema driver 'gradient'
    optimize.schema.json     dfmp2 optimize --json (the last step's gradient document and 'optimization')
    frequencies.schema.json  dfmp2 frequencies --json (Hessian, modes, thermochemistry, symmetry)
    interaction.schema.json  dfmp2 interaction --json
    cbs.schema.json          dfmp2 run --json with a basis bracket (cc-pv[dt]z)
    compare.schema.json      dfmp2 compare --json (a report: top-level keys fixed, its records open)
    regress.schema.json      dfmp2 regress --json (a report, as compare's)
    bench.schema.json        dfmp2 bench's NAME.json (a report, as compare's)
    common.schema.json       the records they share ($defs): energies, geometry, what ran (the SCF,
                             the storage, the cpu BLAS choice), the memory plan, the gradient section

Each record is defined once, in common.schema.json, and referenced by every document that holds it:
adding a field to a record (a dataclass in dfmp2.provenance, dfmp2.io.result, dfmp2.memory) is one
change there, and ``tests/io/test_schemas.py`` fails until it is made. The typed records are strict
(every key required, no other key: a missing or renamed key fails), null where a field does not
apply (RHF and UHF documents have the same keys); what a device's backend adds to ``ran`` is open.

``validate(doc, name)`` checks a document with the ``jsonschema`` package (not a dependency of dfmp2:
``pip install jsonschema``); the schemas themselves are plain JSON for any validator (their ``$id``s
are ``urn:dfmp2:schema:<name>``).
"""

from __future__ import annotations

import json
from importlib import resources

# the documents (kind(doc) names one): the runs', then the tools' reports; "common" holds their $defs
NAMES = ("result", "gradient", "optimize", "frequencies", "interaction", "cbs", "compare", "regress", "bench")
URN = "urn:dfmp2:schema:"


def load(name: str) -> dict:
    """The schema ``name`` (one of NAMES, or 'common') as a dict."""
    if name not in (*NAMES, "common"):
        raise ValueError(f"no schema '{name}'; there are {', '.join(NAMES)} and common")
    return json.loads(resources.files(__package__).joinpath(f"{name}.schema.json").read_text(encoding="utf-8"))


def validator(name: str):
    """A jsonschema validator of document ``name`` with every schema of the package registered (the
    documents refer to common.schema.json and to each other by ``$id``)."""
    try:
        import jsonschema
        from referencing import Registry, Resource
    except ImportError as e:
        raise ImportError(
            "validating dfmp2's JSON documents needs the jsonschema package (pip install jsonschema)"
        ) from e
    registry = Registry().with_resources((URN + n, Resource.from_contents(load(n))) for n in (*NAMES, "common"))
    schema = load(name)
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, registry=registry, format_checker=cls.FORMAT_CHECKER)


def validate(doc: dict, name: str) -> None:
    """Raise jsonschema.ValidationError (the first error found) unless ``doc`` is a valid ``name`` document."""
    validator(name).validate(doc)


def kind(doc: dict) -> str:
    """Which document ``doc`` is (one of NAMES), from the fields each carries: a frequency
    analysis its ``schema`` ('dfmp2-frequencies/<n>'), a CBS extrapolation its ``kind`` 'cbs', an
    optimisation its ``optimization`` record, an interaction its ``interaction_energies``, a
    gradient its ``gradient`` section, a result its ``schema_version``; the reports of compare
    (``devices_requested``), regress (``cases``) and bench (``gemm_peak``). ValueError for what is
    none of them."""
    if not isinstance(doc, dict):
        raise ValueError(f"not a dfmp2 document: a JSON {type(doc).__name__}, not an object")
    if str(doc.get("schema", "")).startswith("dfmp2-frequencies/"):
        return "frequencies"
    if doc.get("kind") == "cbs":
        return "cbs"
    if "interaction_energies" in doc:
        return "interaction"
    if "optimization" in doc:
        return "optimize"
    if "gradient" in doc:
        return "gradient"
    if "schema_version" in doc:
        return "result"
    for name, key in (("compare", "devices_requested"), ("regress", "cases"), ("bench", "gemm_peak")):
        if key in doc:
            return name
    raise ValueError(f"not a dfmp2 document (no schema_version or schema): keys {', '.join(sorted(doc)[:8])}")
