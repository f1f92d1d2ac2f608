"""The man page (docs/pyvmm.1) and bash completion
(scripts/pyvmm-completion.bash), made from the option table that --help
is made from (pyvmm.command.cli: OPTIONS and the device kinds' Options).

    python3 scripts/cli_docs.py          # rewrite both files
    python3 scripts/cli_docs.py --check  # exit 1 if either is stale

tests/test_cli.py checks that the committed files are what this makes.
"""

from __future__ import annotations

from pyvmm import __version__
from pyvmm.command import cli
from pyvmm.vm.config import DEFAULT_MEM_MIB


def roff(text: str) -> str:
    """Text safe in a roff line: backslashes and hyphens escaped, no line
    starting with a control character."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\\&" + text if text.startswith((".", "'")) else text


def _para(text: str) -> str:
    return roff(" ".join(text.split()))


DESCRIPTION = (
    "pyvmm runs one Solo5 hvt unikernel (MirageOS builds, Solo5's own tests, anything "
    "linked against Solo5's hvt bindings) on KVM, with the command line, output and "
    "exit status of solo5\\-hvt. Tender options come before KERNEL; everything after "
    "KERNEL is the guest's command line, even arguments starting with \\-\\-. An option "
    "that takes a value accepts \\-\\-opt=VALUE and \\-\\-opt VALUE, but an optional "
    "value (\\-\\-stats[=INTERVAL], \\-\\-trace[=FILE]) only \\-\\-opt=VALUE: the word after "
    "\\-\\-stats is KERNEL. Each option may be given once. Anything wrong is one line "
    "on standard error starting with \\(lqpyvmm: \\(rq. By default pyvmm prints nothing "
    "solo5\\-hvt would not: -v shows what it decided."
).replace(" -v ", " \\-v ")


def man_page() -> str:
    lines = [
        f'.TH PYVMM 1 "" "pyvmm {__version__}" "User Commands"',
        ".SH NAME",
        "pyvmm \\- run a Solo5 hvt unikernel on KVM",
        ".SH SYNOPSIS",
        ".B pyvmm",
        "[\\fIOPTIONS\\fR] [\\fB\\-\\-\\fR] \\fIKERNEL\\fR [\\fIARGS\\fR...]",
        ".br",
        ".B pyvmm \\-\\-query\\-manifest",
        "[\\fB\\-\\-json\\fR] \\fIKERNEL\\fR",
        ".br",
        ".B pyvmm serve \\-\\-api\\-sock",
        "\\fIPATH\\fR",
        ".br",
        ".B pyvmm run \\-\\-api\\-sock",
        "\\fIPATH\\fR [\\fIOPTIONS\\fR] [\\fB\\-\\-\\fR] \\fIKERNEL\\fR [\\fIARGS\\fR...]",
        ".br",
        ".B pyvmm snapshot \\-\\-api\\-sock",
        "\\fIPATH\\fR [\\fB\\-\\-stop\\fR] \\fIID\\fR \\fIDIR\\fR",
        ".SH DESCRIPTION",
        DESCRIPTION,
        ".PP",
        _para(
            "pyvmm serve is a warm launcher: it imports pyvmm once, then starts each VM as "
            "its own child process on request over the Unix socket PATH (HTTP with JSON "
            "bodies: create, list, wait, counters, stop; pools of VMs prepared ahead). "
            "pyvmm run --api-sock PATH runs a guest through it with the command's options, "
            "console and exit status. SIGTERM or SIGINT to the launcher stops its VMs; "
            "they also end if it is killed. docs/serve.md in pyvmm's source has the API. "
            "pyvmm snapshot --api-sock PATH ID DIR writes a snapshot of the launcher's "
            "running VM ID to the new directory DIR; the guest runs on, or with --stop its "
            "VM ends once the snapshot is written. pyvmm --restore=DIR resumes it."
        ),
        ".SH OPTIONS",
    ]
    for entry in cli.help_entries():
        lines += [".TP", f".B {roff(entry.form)}", _para(entry.help)]
    lines += [".SH EXIT STATUS"]
    for status, meaning in cli.EXIT_STATUSES:
        lines += [".TP", f".B {roff(status)}", _para(meaning)]
    lines += [".SH ENVIRONMENT"]
    for name, meaning in cli.ENVIRONMENT:
        lines += [".TP", f".B {roff(name)}", _para(meaning)]
    lines += [
        ".SH EXAMPLES",
        ".nf",
        roff("pyvmm guests/bin/hello.hvt"),
        roff("pyvmm --mem 64 --net:service0=tap100 --block:storage=disk.img -- app.hvt --arg"),
        roff("pyvmm --query-manifest --json app.hvt"),
        ".fi",
        ".SH NOTES",
        _para(
            f"Guest memory defaults to {DEFAULT_MEM_MIB} MiB and comes in 2 MiB steps; "
            "--mem is rounded down with a note on standard error, as solo5-hvt does. "
            "Block images are locked (flock, exclusive) while a guest uses them. "
            "A stop signal at any moment ends pyvmm with 128 + the signal and one line, "
            "from the first instruction of the pyvmm command: its native launcher blocks "
            "the stop signals before the Python interpreter starts, and pyvmm unblocks them "
            "once its handlers are in (python3 -m pyvmm has no launcher: there the "
            "interpreter's own start-up is left to Python)."
        ),
        ".SH SEE ALSO",
        "solo5\\-hvt(1), solo5\\-elftool(1); README.md and docs/ in pyvmm's source",
    ]
    return "\n".join(lines) + "\n"


def bash_completion() -> str:
    """A bash completion function for pyvmm: option names in every form a
    user types (``--mem=`` and ``--mem``, ``--stats`` and ``--stats=``),
    the choices of options that have them, files and network interfaces
    for values, after ``=`` or as the next word."""
    words, separate, files, ifaces, choices = [], [], [], [], []
    for entry in cli.help_entries():
        for name in entry.names:
            if name.endswith(":"):  # --net:NAME: the name comes next
                words.append(name)
                if entry.takes_value:
                    separate.append(name + "*")
                continue
            if entry.takes_value:
                words.append(name + "=")
            if not entry.takes_value or entry.optional_value:
                words.append(name)
            else:  # --mem N: the value may be the next word
                words.append(name)
                separate.append(name)
        key = entry.names[-1].rstrip(":")  # --net: and --net complete alike
        if entry.complete == "file" and key not in files:
            files.append(key)
        elif entry.complete == "interface" and key not in ifaces:
            ifaces.append(key)
        elif "|" in entry.complete:
            choices.append((key, entry.complete.replace("|", " ")))
    case_lines = [
        f'    {key}) COMPREPLY=($(compgen -W "{values}" -- "$cur")) ;;' for key, values in choices
    ]
    if files:
        case_lines.append(f'    {"|".join(files)}) COMPREPLY=($(compgen -f -- "$cur")) ;;')
    if ifaces:
        case_lines.append(
            f"    {'|'.join(ifaces)}) COMPREPLY=($(compgen -W "
            '"$(ls /sys/class/net 2>/dev/null)" -- "$cur")) ;;'
        )
    case_lines.append("    *) COMPREPLY=() ;;")
    cases = "\n".join(case_lines)
    takes = "|".join(separate)
    return f"""\
# bash completion for pyvmm (generated by scripts/cli_docs.py from pyvmm's
# option table; do not edit). Use: source scripts/pyvmm-completion.bash
#
# The line is read from COMP_LINE split at blanks only, so --shm=po is one
# word whether or not COMP_WORDBREAKS holds '=' and ':'; the replies are
# then cut to the part bash is replacing (its own current word).

# The values of option KEY (--cpl, --block:NAME) that start with $2.
_pyvmm_values()
{{
    local key=${{1%%:*}} cur=$2
    case $key in
{cases}
    esac
}}

_pyvmm()
{{
    local line=${{COMP_LINE:0:COMP_POINT}} word full= i n
    local -a args
    read -ra args <<<"$line"
    n=${{#args[@]}}
    if [[ $line != *[[:blank:]] && $n -gt 0 ]]; then
        full=${{args[n - 1]}}
        ((n--))
    fi
    local cur=$full
    COMPREPLY=()
    # After KERNEL everything belongs to the guest: complete files only.
    for ((i = 1; i < n; i++)); do
        word=${{args[i]}}
        case $word in
        --) cur=files; break ;;
        *=*) ;;
        {takes})
            # its value is the next word, perhaps the one being completed
            ((i + 1 < n)) && ((i++)) || {{ _pyvmm_values "$word" "$full"; cur=done; break; }} ;;
        -*) ;;
        *) cur=files; break ;;
        esac
    done
    if [[ $cur == files ]]; then
        COMPREPLY=($(compgen -f -- "$full"))
    elif [[ $cur != done ]]; then
        if [[ $full == -*=* ]]; then
            _pyvmm_values "${{full%%=*}}" "${{full#*=}}"
            for i in "${{!COMPREPLY[@]}}"; do
                COMPREPLY[i]=${{full%%=*}}=${{COMPREPLY[i]}}
            done
        elif [[ $full == -* ]]; then
            COMPREPLY=($(compgen -W "{" ".join(words)}" -- "$full"))
        else
            COMPREPLY=($(compgen -f -- "$full"))
        fi
    fi
    # bash replaces only its own current word, which COMP_WORDBREAKS may
    # have cut after a '=' or ':': drop what comes before it.
    local bash_cur=${{COMP_WORDS[COMP_CWORD]}} pre
    [[ $bash_cur == [=:] ]] && bash_cur=
    if [[ $full == *"$bash_cur" ]]; then
        pre=${{full%"$bash_cur"}}
        for i in "${{!COMPREPLY[@]}}"; do
            COMPREPLY[i]=${{COMPREPLY[i]#"$pre"}}
        done
    fi
    if [[ ${{#COMPREPLY[@]}} -eq 1 && ${{COMPREPLY[0]}} == *[=:] ]]; then
        compopt -o nospace 2>/dev/null
    fi
}}
complete -F _pyvmm pyvmm
"""
