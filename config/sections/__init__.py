"""The sections of `FinetuneConfig`, one module per concern; `config/schema.py` assembles them into the whole run.

Import from `config.schema`: it re-exports every name defined here, so callers never depend on which module of this
package a section lives in. The modules import `base` and nothing of each other, so none can form a cycle.
"""
