// A modal dialog for the few questions the page asks: the API key, a new title, a confirmation.

import { $ } from './dom.js';

/**
 * Shows the dialog; resolves to the input's value (or '' without an input) on OK, null on cancel.
 * ask({title, message, input: {type, value, placeholder}, ok, danger})
 */
export function ask({ title, message = '', input = null, ok = 'OK', danger = false }) {
  const dialog = $('dialog');
  const field = $('dialog-input');
  $('dialog-title').textContent = title;
  $('dialog-message').textContent = message;
  $('dialog-message').hidden = !message;
  field.hidden = !input;
  field.type = (input && input.type) || 'text';
  field.value = (input && input.value) || '';
  field.placeholder = (input && input.placeholder) || '';
  $('dialog-ok').textContent = ok;
  $('dialog-ok').classList.toggle('danger', danger);
  $('dialog-ok').classList.toggle('primary', !danger);
  return new Promise((resolve) => {
    const finish = (value) => {
      $('dialog-form').removeEventListener('submit', onSubmit);
      $('dialog-cancel').removeEventListener('click', onCancel);
      dialog.removeEventListener('cancel', onCancel);
      dialog.close();
      resolve(value);
    };
    const onSubmit = (event) => { event.preventDefault(); finish(input ? field.value : ''); };
    const onCancel = (event) => { event.preventDefault(); finish(null); };
    $('dialog-form').addEventListener('submit', onSubmit);
    $('dialog-cancel').addEventListener('click', onCancel);
    dialog.addEventListener('cancel', onCancel);
    dialog.showModal();
    (input ? field : $('dialog-ok')).focus();
  });
}
