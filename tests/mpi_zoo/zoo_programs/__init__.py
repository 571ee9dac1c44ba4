"""The zoo's programs, one module per MPI Bugs Initiative class; importing this registers them all
(zoo_registry.PROGRAMS).  Each module's docstring says what MPI forbids there."""

from zoo_programs import (buffering_hazard, call_matching, global_concurrency, invalid_parameter,  # noqa: F401
                          local_concurrency, message_race, parameter_matching, request_lifecycle, resource_leak)
