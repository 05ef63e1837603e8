"""How hard the kill storms, the chaos soaks and the random crash rounds push (one knob).

``LOUSHO_STRESS`` picks a level; every test marked ``stress`` reads its strength here:

========  ===============  ==========  ===============  ===================
level     kills per store  soak turns  PostgreSQL soak  random crash rounds
========  ===============  ==========  ===============  ===================
(unset)   10               40          40 turns, 1      0 (+ every kill
                                       outage           point once)
``ci``    50               120         40 turns, 1      25 per store
``long``  300              500         100 turns, 3     100 per store
========  ===============  ==========  ===============  ===================

The default keeps ``pytest`` a few minutes on two cores with every storm and soak still run
for real (real SIGKILLs, real outages, the same checks); ``.ci/run`` runs the ``stress``
tests again with ``LOUSHO_STRESS=ci pytest -m stress``; ``long`` is the run before a release
or after touching commits, leases or checkpoints. The older single knobs still override
their part: ``LOUSHO_STORM_KILLS``, ``LOUSHO_SOAK_TURNS``, ``LOUSHO_SOAK_PG_SPELLS``.
"""

from __future__ import annotations

import os

LEVELS: dict[str, dict[str, int]] = {
    "default": {"kills": 10, "soak_turns": 40, "pg_soak_turns": 40, "pg_spells": 1,
                "crash_rounds": 0},
    "ci": {"kills": 50, "soak_turns": 120, "pg_soak_turns": 40, "pg_spells": 1,
           "crash_rounds": 25},
    "long": {"kills": 300, "soak_turns": 500, "pg_soak_turns": 100, "pg_spells": 3,
             "crash_rounds": 100},
}

LEVEL = os.environ.get("LOUSHO_STRESS", "").strip().lower() or "default"
if LEVEL not in LEVELS:
    raise ValueError(f"LOUSHO_STRESS={os.environ.get('LOUSHO_STRESS')!r} is not a level: "
                     "leave it unset, or set it to 'ci' or 'long'")


def _knob(name: str, variable: str | None = None) -> int:
    value = os.environ.get(variable, "").strip() if variable else ""
    if not value:
        return LEVELS[LEVEL][name]
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{variable}={value!r} must be a whole number of at least 1")
    return int(value)


STORM_KILLS = _knob("kills", "LOUSHO_STORM_KILLS")
"""SIGKILLs per store in each kill storm (test_storm, test_event_storm, test_mail_storm)."""
SOAK_TURNS = _knob("soak_turns", "LOUSHO_SOAK_TURNS")
"""Questions each chaos soak asks (the PostgreSQL one at most ``PG_SOAK_TURNS``)."""
PG_SOAK_TURNS = min(SOAK_TURNS, _knob("pg_soak_turns"))
"""Questions the PostgreSQL soak asks: each outage there lasts the store's connection
retries (about 27 s), so it asks fewer."""
SOAK_PG_SPELLS = _knob("pg_spells", "LOUSHO_SOAK_PG_SPELLS")
"""PostgreSQL outages in its soak."""
CRASH_RANDOM_ROUNDS = _knob("crash_rounds")
"""Rounds at a random kill point per store in test_crash, after every point once."""
