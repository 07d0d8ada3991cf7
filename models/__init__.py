"""pagedstate.models: executable models. The reference pool, store and coordinator
(:mod:`.reference`), the explored world (:mod:`.world`), the exhaustive explorer
(:mod:`.explorer`), planted bugs (:mod:`.mutants`) and the CLI (:mod:`.cli`)."""
