# Sourced by the Flickr8k sweeps (flickr8k_experiments.sh, flickr8k_backbones.sh, flickr8k_full.sh), so that a sweep
# run again carries on where it stopped: a run whose training finished is not trained again, one cut short continues
# from its last.pt with --resume, one not begun starts. scripts/run_state.py says where a run folder stands (new,
# stopped, trained, scored) from the files the commands write: finished.json when training ends (for a run trained
# before that file was written, its history and config), the scores after that.

# RUN COMMAND...: run the training COMMAND (`captioner train CONFIG overrides...`, perhaps behind a timer) into RUN,
# adding train.out_dir=RUN, and --resume where RUN's training was cut short; nothing where it finished.
train_step() {
    local run=$1 state
    shift
    state=$(python scripts/run_state.py "$run")
    case $state in
        scored) echo "== $run: finished (trained, then scored): skipped" ;;
        trained) echo "== $run: trained already (its training finished), not trained again" ;;
        stopped) echo "== $run: cut short, resuming from its last.pt"
                 "$@" "train.out_dir=$run" --resume ;;
        *) echo "== $run: training"
           "$@" "train.out_dir=$run" ;;
    esac
}

# RUN COMMAND...: run the scoring COMMAND (`captioner evaluate RUN/best.pt --out RUN ...`) unless RUN's scores file
# was written after its training finished (train_step said so).
evaluate_step() {
    local run=$1 state
    shift
    state=$(python scripts/run_state.py "$run")
    [ "$state" = scored ] || "$@"
}
