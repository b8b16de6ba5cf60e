"""The ``validate`` stage's Great Expectations adapter: a contract given as plain data
(:func:`hargo.data.validate.expectation_specs`' dicts) run over in-memory tables in an ephemeral
GX 1.x context (pandas data source; one ExpectationSuite, ValidationDefinition and Checkpoint per
table), optionally building GX's HTML data docs. Great Expectations and pandas are imported
when :func:`run_suites` runs, not with this module. :mod:`hargo.data.validate` re-exports both
names.
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["MAX_IDS", "run_suites"]

MAX_IDS = 5  # offending ids listed per failed expectation


def run_suites(tables: dict[str, list[dict]], specs: list[dict], docs_dir: Path | None) -> list[dict]:
    """Validate each table with GX (ephemeral context, pandas data source, one ExpectationSuite,
    ValidationDefinition and Checkpoint per table) and, if ``docs_dir`` is given, build GX's
    HTML data docs there.

    Args:
        tables: ``{dataset: rows}``; every row has an ``id``.
        specs: from :func:`hargo.data.validate.expectation_specs`.

    Returns:
        One entry per spec, in order: ``dataset, name, type, column, description, enforced,
        success, failing, element_count, ids`` (up to :data:`MAX_IDS` offending ids).
    """
    import warnings

    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import great_expectations as gx
        import pandas as pd
        from great_expectations.data_context.types.base import ProgressBarsConfig
        from great_expectations.expectations.row_conditions import Column

        ctx = gx.get_context(mode="ephemeral")
        ctx.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
        actions = []
        if docs_dir is not None:
            ctx.add_data_docs_site(site_name="hargo", site_config={
                "class_name": "SiteBuilder",
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
                "store_backend": {"class_name": "TupleFilesystemStoreBackend",
                                  "base_directory": str(Path(docs_dir).resolve())}})
            actions = [gx.checkpoint.UpdateDataDocsAction(name="data_docs", site_names=["hargo"])]
        source = ctx.data_sources.add_pandas("hargo")
        entries: dict[int, dict] = {}
        for dataset, rows in tables.items():
            mine = [(k, s) for k, s in enumerate(specs) if s["dataset"] == dataset]
            if not mine:
                continue
            suite = ctx.suites.add(gx.ExpectationSuite(name=f"hargo-{dataset}"))
            for k, s in mine:
                kw = dict(s["kwargs"])
                if s["where"] is not None:
                    kw["row_condition"] = Column(s["where"][0]).is_in(s["where"][1])
                kw["meta"] = {"hargo_spec": k, "name": s["name"], "enforced": s["enforced"],
                              "description": s["description"]}
                suite.add_expectation(getattr(gx.expectations, s["type"])(**kw))
            batch = source.add_dataframe_asset(dataset).add_batch_definition_whole_dataframe("all")
            vd = ctx.validation_definitions.add(gx.ValidationDefinition(
                name=f"hargo-{dataset}", data=batch, suite=suite))
            cp = ctx.checkpoints.add(gx.Checkpoint(
                name=f"hargo-{dataset}", validation_definitions=[vd], actions=actions,
                result_format={"result_format": "COMPLETE", "unexpected_index_column_names": ["id"]}))
            frame = pd.DataFrame(rows) if rows else pd.DataFrame({"id": []})
            result = cp.run(batch_parameters={"dataframe": frame})
            for vr in result.run_results.values():
                for r in vr.results:
                    k = r.expectation_config.meta["hargo_spec"]
                    s = specs[k]
                    res = r.result or {}
                    ids = []
                    for item in res.get("unexpected_index_list") or []:
                        i = item.get("id") if isinstance(item, dict) else item
                        if i not in ids:
                            ids.append(i)
                    failing = res.get("unexpected_count")
                    if failing is None:  # an exception inside GX: count the whole table
                        failing = 0 if r.success else len(rows)
                    entries[k] = {"dataset": s["dataset"], "name": s["name"], "type": s["type"],
                                  "column": s["kwargs"].get("column"), "description": s["description"],
                                  "enforced": s["enforced"], "success": bool(r.success),
                                  "failing": int(failing),
                                  "element_count": int(res.get("element_count", len(rows)) or 0),
                                  "ids": [str(i) for i in ids[:MAX_IDS]]}
    return [entries[k] for k in sorted(entries)]
