# Two commands on a fresh machine: `make report` (the report) and `make test` (the test suite).
# Both create/update a local virtual environment in .venv and install the project into it.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.ipynb))
# Extra pytest arguments, e.g. PYTEST_ARGS="--random-order-bucket=global" (pytest-random-order) or "-k NAME".
PYTEST_ARGS ?=

.PHONY: report test test-python test-notebooks env clean

$(STAMP): pyproject.toml constraints/ci.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints/ci.txt -e ".[notebooks,test]"
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3" > /dev/null
	touch $(STAMP)

env: $(STAMP)

# Executes every notebook with papermill into reports/ (replays data/ without a GPU, measures with one).
report: $(STAMP)
	$(PY) -m perfutils.report --notebooks $(NOTEBOOKS) --out reports

test: test-python test-notebooks

test-python: $(STAMP)
	$(PY) -m pytest tests $(PYTEST_ARGS)

test-notebooks: $(STAMP)
	$(PY) -m pytest --nbval-lax --nbval-current-env --sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider notebooks $(PYTEST_ARGS)

clean:
	rm -rf reports
