# Two commands on a fresh machine: `make report` (the report) and `make test` (the test suite);
# `make lab` opens copies of the notebooks in JupyterLab. All create/update a local virtual environment in .venv
# and install the project into it.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.ipynb))
# Extra pytest arguments, e.g. PYTEST_ARGS="--random-order-bucket=global" (pytest-random-order) or "-k NAME".
PYTEST_ARGS ?=

.PHONY: report test test-python test-notebooks test-lab lab lab-reset env clean

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

# JupyterLab on the collection, kernel "python3" = this .venv (the env's kernelspec wins over a user's),
# ipywidgets live. It opens copies of the notebooks in lab/ (ignored by git), so that a session never writes outputs
# into the tracked notebooks; a copy is taken again when its notebook changed (yours is kept as *.previous), and
# `make lab-reset` takes fresh copies of all. JupyterLab's news prompt and update check are off.
# Options go to jupyter lab: make lab LAB_ARGS="--port 8899 --no-browser --ip 127.0.0.1"
LAB_ARGS ?=
LAB_COPIES := $(patsubst notebooks/%,lab/%,$(NOTEBOOKS))
LAB_SETTINGS := $(VENV)/share/jupyter/lab/settings/overrides.json

lab/%.ipynb: notebooks/%.ipynb
	@mkdir -p lab
	@if [ -f $@ ]; then mv $@ $@.previous; echo "$< changed: fresh copy $@ (yours: $@.previous)"; fi
	cp $< $@

$(LAB_SETTINGS): $(STAMP)
	mkdir -p $(dir $@)
	printf '%s\n' '{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}}' > $@

lab: $(STAMP) $(LAB_SETTINGS) $(LAB_COPIES)
	JUPYTER_PREFER_ENV_PATH=1 $(VENV)/bin/jupyter lab --ServerApp.root_dir="$(CURDIR)" \
		--LabApp.default_url=/lab/tree/lab --LabApp.news_url=None \
		--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate \
		$(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

lab-reset:
	rm -f $(LAB_COPIES) $(addsuffix .previous,$(LAB_COPIES))
	$(MAKE) $(LAB_COPIES)

test: test-python test-notebooks

test-python: $(STAMP)
	$(PY) -m pytest tests $(PYTEST_ARGS)

test-notebooks: $(STAMP)
	$(PY) -m pytest --nbval-lax --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider notebooks $(PYTEST_ARGS)

# Only the browser check: JupyterLab + notebooks 04 and 12's widgets in headless Chromium (skips without Chromium).
test-lab: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider tests/test_lab_browser.py

clean:
	rm -rf reports
