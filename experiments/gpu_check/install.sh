# Install the project and its missing dependencies from a folder of wheels (fill_wheels.py), offline,
# into two --target folders, and put them on PYTHONPATH and PATH. Source it:
#   source experiments/gpu_check/install.sh [WHEELS=.whl] [SITE=/tmp/mcsd_site]
# The project and the other wheels go into separate targets: pip --target --upgrade replaces a
# whole top-level folder, and several wheels share the hydra_plugins/ namespace folder. A site that
# already holds these very wheels (SITE/installed.sha256) is used as it is, without installing again.
# PYTHON (default python3) is the interpreter that holds torch.
mcsd_install() {
    local wheels=${1:-.whl} site=${2:-/tmp/mcsd_site} python=${PYTHON:-python3}
    local project=() dependencies=() wheel
    for wheel in "$wheels"/*.whl; do
        case "$(basename "$wheel")" in
            mcsd-*) project+=("$wheel") ;;
            *) dependencies+=("$wheel") ;;
        esac
    done
    if [ ${#project[@]} -ne 1 ]; then
        echo "install.sh: $wheels holds ${#project[@]} mcsd wheels: fill it with experiments/gpu_check/fill_wheels.py $wheels" >&2
        return 1
    fi
    # The same wheels installed before into this site (a warm machine, a second source): nothing to install.
    local stamp="$site/installed.sha256" sums
    sums=$(cd "$wheels" && sha256sum -- *.whl) || return 1
    if [ "$(cat "$stamp" 2>/dev/null)" != "$sums" ]; then
        rm -f "$stamp"
        local options=(-m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade)
        if [ ${#dependencies[@]} -gt 0 ]; then
            "$python" "${options[@]}" --target "$site/dependencies" "${dependencies[@]}" || return 1
        fi
        "$python" "${options[@]}" --target "$site/project" "${project[0]}" || return 1
        printf '%s\n' "$sums" > "$stamp"
    fi
    export PYTHONPATH="$site/project:$site/dependencies${PYTHONPATH:+:$PYTHONPATH}"
    export PATH="$site/project/bin:$site/dependencies/bin:$PATH"
}
mcsd_install "$@"
