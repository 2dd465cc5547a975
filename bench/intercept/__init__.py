"""Intercept benchmark (INFERCEPT, ICML 2024) of heliosd's Session RPC: workloads built from real
tool-use data (workloads.py), an asyncio client that plays the tool and the human (client.py), the
sweep over hold policies and request rates (run.py, run_intercept_bench.sh) and its report
(report.py). bench/README.md, section "Intercept benchmark", says how to run it."""
